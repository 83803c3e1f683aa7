// Package readme_test checks that every Go snippet of the README compiles against the
// packages it shows, so that the front door never shows code that does not build.
package readme_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// prelude is what every snippet may use without declaring it: the imports the README's
// code names, and the variables its prose gives (a client, a limiter, the jobs...).
const prelude = `package snippet

import (
	"context"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

var (
	_ = http.Client{}
	_ = time.Second
	_ = asynq.Config{}
	_ = asynqmw.New
	_ = waiter.NewTransport
)

func snippet(ctx context.Context, rdb *redis.Client, lim *throttle.Limiter, jobs chan string, job string,
	call func(string), retryLater func(string, time.Duration), handler asynq.Handler,
	buildReport func(context.Context) error, estimate func(*http.Request) map[string]int,
	usage func(*http.Response, []byte) map[string]int) error {
`

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

func TestREADMESnippetsCompile(t *testing.T) {
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlock.FindAllStringSubmatch(string(text), -1)
	if len(blocks) == 0 {
		t.Fatal("the README has no Go snippet")
	}
	imp := exportImporter(t, "github.com/hibiken/asynq", "github.com/jobthrottle/jobthrottle/asynqmw",
		"github.com/jobthrottle/jobthrottle/throttle", "github.com/jobthrottle/jobthrottle/waiter",
		"github.com/redis/go-redis/v9", "net/http")
	for i, b := range blocks {
		src := prelude + b[1] + "\treturn nil\n}\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "snippet.go", src, 0)
		if err != nil {
			t.Errorf("snippet %d does not parse: %v\n%s", i+1, err, b[1])
			continue
		}
		var hard []string
		conf := types.Config{Importer: imp, Error: func(err error) {
			var te types.Error
			if errors.As(err, &te) && te.Soft && strings.Contains(te.Msg, "declared and not used") {
				return // a snippet shows a step; what follows it is the reader's
			}
			hard = append(hard, err.Error())
		}}
		_, _ = conf.Check("snippet", fset, []*ast.File{f}, nil)
		if len(hard) > 0 {
			t.Errorf("snippet %d does not compile:\n%s\n%s", i+1, strings.Join(hard, "\n"), b[1])
		}
	}
}

// exportImporter returns an importer of the compiled export data of pkgs and their
// dependencies, which go list finds (and builds, if needed) in the build cache.
func exportImporter(t *testing.T, pkgs ...string) types.Importer {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}"}, pkgs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.String())
	}
	files := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, file, ok := strings.Cut(sc.Text(), " "); ok && file != "" {
			files[path] = file
		}
	}
	return importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		file, ok := files[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
}
