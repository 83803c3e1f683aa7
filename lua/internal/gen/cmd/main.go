// Command cmd writes lua/gen/*.lua from the sources in lua/ (see package gen); go
// generate ./lua runs it in lua/.
package main

import (
	"log"
	"os"
	"path/filepath"

	"github.com/jobthrottle/jobthrottle/lua/internal/gen"
)

func main() {
	scripts, err := gen.Generate(".")
	if err != nil {
		log.Fatal(err)
	}
	for name, text := range scripts {
		if err := os.WriteFile(filepath.Join("gen", name+".lua"), text, 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
