package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// FiguresFile is where Figure collects measured figures when CI is set: CI's
// `go test ./...` prints nothing of passing tests, so .ci/run prints this file after
// the tests instead (and removes it).
var FiguresFile = filepath.Join(os.TempDir(), "jobthrottle-figures.log")

// Figure logs a measured figure (t.Logf) and, when the CI environment variable is set,
// adds it, under the test's name, to FiguresFile.
func Figure(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Log(msg)
	if os.Getenv("CI") == "" {
		return
	}
	f, err := os.OpenFile(FiguresFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Logf("figures file: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s: %s\n", t.Name(), msg)
}
