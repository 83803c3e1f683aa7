// Command cmd writes lua/gen/*.lua from the sources in lua/ (see package gen); go
// generate ./lua runs it in lua/.
package main

import (
	"log"

	"github.com/jobthrottle/jobthrottle/lua/internal/gen"
)

func main() {
	if err := gen.Write("."); err != nil {
		log.Fatal(err)
	}
}
