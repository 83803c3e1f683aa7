// Package lua holds jobthrottle's Redis scripts: one per algorithm and one for the
// semaphore.
//
// The sources are the *.lua files here, each opening with its contract: common.lua (the
// clock, argument checks, the control key, booking records, replies), limiter.lua (the
// driver of every limiter script and its protocol), one file per algorithm (log.lua,
// bucket.lua, window.lua) and semaphore.lua. go generate ./lua assembles the scripts Redis
// runs into gen/<name>.lua (package gen under internal/); a test fails when one is stale.
// A call is a batch of requests decided in order at one server instant, written after
// every read and check; a caller must not let a client re-send one (docs/design.md).
package lua

//go:generate go run ./internal/gen/cmd

import (
	"embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed gen/*.lua
var generated embed.FS

// scripts holds each script, made once (its SHA computed once), by name.
var scripts = map[string]*redis.Script{}

func init() {
	for _, name := range []string{"log", "bucket", "window", "semaphore"} {
		scripts[name] = redis.NewScript(Source(name))
	}
}

// Script returns the script name names: "log" (SlidingWindow and SlidingCounter),
// "bucket" (TokenBucket), "window" (FixedWindow) or "semaphore". It panics on any other
// name.
func Script(name string) *redis.Script {
	s, ok := scripts[name]
	if !ok {
		panic(fmt.Sprintf("lua: no script %q", name))
	}
	return s
}

// Source returns the text of the script name names (see Script), as Redis runs it.
func Source(name string) string {
	text, err := generated.ReadFile("gen/" + name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("lua: no script %q", name))
	}
	return string(text)
}
