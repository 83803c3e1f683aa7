package redistest

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// SetError refuses a transaction as Redis does: MULTI passes, the command queued is
// refused, EXEC answers EXECABORT; the connection stays in step for what follows.
func TestSetErrorRefusesAsRedis(t *testing.T) {
	b := NewMiniRealTime(t)
	ctx := context.Background()
	conn := b.Client.(*redis.Client).Conn()
	defer conn.Close()
	if err := b.Mini.Set("k", "v"); err != nil {
		t.Fatal(err)
	}

	b.SetError("LOADING Redis is loading the dataset in memory")
	steps := []struct {
		args []any
		want string // the reply, or the error's start
	}{
		{[]any{"GET", "k"}, "LOADING"},
		{[]any{"MULTI"}, "OK"},
		{[]any{"GET", "k"}, "LOADING"},
		{[]any{"EXEC"}, "EXECABORT"},
	}
	for _, s := range steps {
		got, err := conn.Do(ctx, s.args...).Result()
		if err != nil {
			got = err.Error()
		}
		if g, _ := got.(string); !strings.HasPrefix(g, s.want) {
			t.Errorf("%v while refused: %v; want %s", s.args, got, s.want)
		}
	}
	b.SetError("")
	if got, err := conn.Get(ctx, "k").Result(); got != "v" || err != nil {
		t.Errorf("GET after the error: %q, %v; want \"v\", nil", got, err)
	}
}
