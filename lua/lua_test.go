package lua

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// Every script opens with its contract: name, KEYS, ARGV, Returns, Writes.
func TestHeaders(t *testing.T) {
	files, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		switch f {
		case "prelude.lua", "controlwrite.lua", "log.lua", "tbstate.lua", "fwstate.lua", "inspectlog.lua", "batch.lua", "decide.lua", "fast.lua", "faststring.lua", "inspect.lua":
			continue // helpers, not scripts: they open with what they provide
		}
		if strings.HasSuffix(f, "_fast.lua") {
			continue // a script's fast path: the script's header is its contract
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var header []string
		for _, line := range strings.Split(string(src), "\n") {
			if !strings.HasPrefix(line, "--") {
				break
			}
			header = append(header, line)
		}
		h := strings.Join(header, "\n")
		if !strings.HasPrefix(h, "-- "+f+": ") {
			t.Errorf("%s: header does not start with %q", f, "-- "+f+": ")
		}
		for _, want := range []string{"-- KEYS[1]", "-- ARGV[1]", "-- Returns", "-- Writes"} {
			if !strings.Contains(h, want) {
				t.Errorf("%s: header lacks %q", f, want)
			}
		}
		// every KEYS[i] and ARGV[i] the code reads is in the header
		body := string(src[len(h):])
		for _, m := range regexp.MustCompile(`(KEYS|ARGV)\[(\d+)\]`).FindAllString(body, -1) {
			if !strings.Contains(h, m) {
				t.Errorf("%s: reads %s, which the header does not describe", f, m)
			}
		}
	}
}

// script is one script with arguments that work, to be broken one at a time.
type script struct {
	name string
	s    *redis.Script
	keys []string
	good []any
}

func scripts(prefix string) []script {
	tag := "{" + prefix + "k}"
	return []script{
		{"slidingwindow", SlidingWindow.Script(), []string{tag + ":sw", tag + ":pause"}, []any{0, 1, 0, 1, 5, 1000000}},
		{"slidingcounter", SlidingCounter.Script(), []string{tag + ":sc", tag + ":pause"}, []any{0, 1, 0, 1, 100000, 5, 1000000}},
		{"gcra", GCRA.Script(), []string{tag + ":tb", tag + ":pause"}, []any{0, 1, 0, 1, 5, 1000000, 5}},
		{"fixedwindow", FixedWindow.Script(), []string{tag + ":fw", tag + ":pause"}, []any{0, 1, 0, 1, 5, 1000000}},
		{"pause", Pause.Script(), []string{tag + ":pause"}, []any{1000}},
		{"control", Control.Script(), []string{tag + ":pause"}, []any{0, 1000000, 1, 5, 0}},
		{"inspect_sw", InspectSlidingWindow.Script(), []string{tag + ":sw", tag + ":pause"}, []any{0, 1, 0, 1, 5, 1000000}},
		{"inspect_sc", InspectSlidingCounter.Script(), []string{tag + ":sc", tag + ":pause"}, []any{0, 1, 0, 1, 100000, 5, 1000000}},
		{"inspect_tb", InspectGCRA.Script(), []string{tag + ":tb", tag + ":pause"}, []any{0, 1, 0, 1, 5, 1000000, 5}},
		{"inspect_fw", InspectFixedWindow.Script(), []string{tag + ":fw", tag + ":pause"}, []any{0, 1, 0, 1, 5, 1000000}},
		{"inspect_sem", InspectSemaphore.Script(), []string{tag + ":sem", tag + ":semq", tag + ":semx", tag + ":pause"}, []any{10}},
	}
}

// Bad arguments get a JTARG error before anything is written; good ones work.
func TestBadArgumentsWriteNothing(t *testing.T) {
	bad := []any{"", "x", "1.5", "1e3", "inf", "nan", "0x10", "-1", "99999999999999999999", " 1"}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, sc := range scripts(b.Prefix) {
			for i := range sc.good {
				for _, v := range bad {
					args := append([]any(nil), sc.good...)
					args[i] = v
					err := sc.s.Run(ctx, b.Client, sc.keys, args...).Err()
					if err == nil || !strings.Contains(err.Error(), "JTARG") {
						t.Fatalf("%s ARGV[%d]=%q: %v, want a JTARG error", sc.name, i+1, v, err)
					}
					if n := b.Client.Exists(ctx, sc.keys...).Val(); n != 0 {
						t.Fatalf("%s ARGV[%d]=%q: %d keys written", sc.name, i+1, v, n)
					}
				}
			}
			// too few and too many arguments
			for _, args := range [][]any{sc.good[:len(sc.good)-1], append(append([]any(nil), sc.good...), 1)} {
				if sc.name == "pause" && len(args) > 1 {
					continue // pause reads ARGV[1] only
				}
				if err := sc.s.Run(ctx, b.Client, sc.keys, args...).Err(); err == nil || !strings.Contains(err.Error(), "JTARG") {
					t.Fatalf("%s with %d arguments: %v, want JTARG", sc.name, len(args), err)
				}
			}
			if err := sc.s.Run(ctx, b.Client, sc.keys, sc.good...).Err(); err != nil {
				t.Fatalf("%s with good arguments: %v", sc.name, err)
			}
			b.Client.Del(ctx, sc.keys...)
		}
	})
}
