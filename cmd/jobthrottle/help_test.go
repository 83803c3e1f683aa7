package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// runNoRedis runs the command where no Redis is configured: help and usage errors
// must not need one.
func runNoRedis(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb, func(string) string { return "" })
	return code, out.String(), errb.String()
}

// Every way of asking for help prints it on stdout and exits 0, without Redis.
func TestHelp(t *testing.T) {
	general := []string{"usage: jobthrottle [flags] COMMAND", "commands:", "  show     print a key's live state once",
		"-h HOST", "jobthrottle help COMMAND"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, general},
		{[]string{"-help"}, general},
		{[]string{"-h"}, general}, // -h without a host
		{[]string{"help"}, general},
		{[]string{"-prefix", "x:", "--help"}, general},
		{[]string{"help", "show"}, []string{"usage: jobthrottle [flags] show [flags] KEY", "-limit R/P[:B]     a limit", "example:\n  $ jobthrottle show vendor-api"}},
		{[]string{"show", "--help"}, []string{"usage: jobthrottle [flags] show [flags] KEY"}},
		{[]string{"show", "-h"}, []string{"usage: jobthrottle [flags] show [flags] KEY"}},
		{[]string{"show", "vendor-api", "-help"}, []string{"usage: jobthrottle [flags] show [flags] KEY"}},
		{[]string{"help", "pause"}, []string{"usage: jobthrottle [flags] pause KEY DURATION", "$ jobthrottle pause vendor-api 30s\n  paused vendor-api for 30s"}},
		{[]string{"help", "set"}, []string{"KEY RATE/PERIOD[:BURST]...", "-for D", "$ jobthrottle set -for 1h vendor-api 2/1m"}},
		{[]string{"help", "reset"}, []string{"-yes", "What is set on the key is kept: the pause, the override and\noperators' weights"}},
		{[]string{"help", "weight"}, []string{"usage: jobthrottle [flags] weight KEY TENANT (WEIGHT DURATION | clear)",
			"$ jobthrottle weight vendor-api acme 3 10m\n", "$ jobthrottle weight vendor-api acme clear\n"}},
		{[]string{"help", "help"}, []string{"usage: jobthrottle help [COMMAND | acl]"}},
		{[]string{"-prefix", "acme:", "help", "acl"}, []string{"ACL SETUSER worker on >secret resetkeys ~{acme:* ", "+ping +scan +watch", "+cluster|slots"}},
	} {
		code, out, errs := runNoRedis(c.args...)
		if code != 0 || errs != "" {
			t.Errorf("%q: status %d, stderr %q; want 0 and nothing", c.args, code, errs)
			continue
		}
		mustContain(t, strings.Join(c.args, " "), out, c.want...)
	}
	for _, c := range commands { // every command's help has its arguments, what it does and an example
		code, out, _ := runNoRedis("help", c.name)
		if code != 0 || !strings.Contains(out, "usage: jobthrottle") || c.name != "help" && (c.about == "" || !strings.Contains(out, "example:\n  $ jobthrottle "+c.name)) {
			t.Errorf("help %s: status %d:\n%s", c.name, code, out)
		}
		for _, f := range c.flags {
			if flagHelp[f] == "" {
				t.Errorf("%s's flag -%s has no help", c.name, f)
			}
		}
	}
}

// Bad usage: status 2, one line on stderr with a pointer to help, nothing on stdout.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "jobthrottle: no command (see 'jobthrottle --help')"},
		{[]string{"frobnicate"}, `jobthrottle: unknown command "frobnicate" (see 'jobthrottle --help')`},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"show"}, "jobthrottle: show takes KEY, got 0 arguments (see 'jobthrottle help show')"},
		{[]string{"show", "a", "b"}, "show takes KEY, got 2 arguments (see 'jobthrottle help show')"},
		{[]string{"pause", "vendor-api"}, "pause takes KEY DURATION, got 1 argument (see 'jobthrottle help pause')"},
		{[]string{"pause", "-yes", "vendor-api", "30s"}, "pause does not take -yes (see 'jobthrottle help pause')"},
		{[]string{"show", "-limit", "ten/1s", "k"}, `rate "ten" is not a positive integer (see 'jobthrottle help show')`},
		{[]string{"show", "-alg", "gcra", "k"}, `-alg "gcra": want one of sw, sc, tb, fw`},
		{[]string{"watch", "-interval", "0s", "k"}, "-interval 0s is not positive"},
		{[]string{"set", "-for", "-1m", "k", "1/1s"}, "-for -1m0s is negative"},
		{[]string{"pause", "vendor-api", "-5s"}, "pause vendor-api: -5s is not a positive duration: a pause lasts that long from now (e.g. 30s, 5m); 'jobthrottle resume vendor-api' ends one (see 'jobthrottle help pause')"},
		{[]string{"pause", "-5s", "vendor-api"}, `pause -5s: "vendor-api" is not a duration (e.g. 30s, 5m)`},
		{[]string{"pause", "vendor-api", "0s"}, "pause vendor-api: 0s is not a positive duration"},
		{[]string{"pause", "vendor-api", "soon"}, `pause vendor-api: "soon" is not a duration (e.g. 30s, 5m)`},
		{[]string{"pause", "tenant\t7", "-1h"}, `pause "tenant\t7": -1h is not a positive duration`},
		{[]string{"show", "-nosuch", "k"}, "flag provided but not defined: -nosuch (see 'jobthrottle help show')"},
		{[]string{"-h", "localhost", "-p"}, "flag needs an argument: -p (see 'jobthrottle --help')"},
		{[]string{"weight", "k", "acme"}, "weight takes KEY TENANT (WEIGHT DURATION | clear), got 2 arguments (see 'jobthrottle help weight')"},
		{[]string{"weight", "k", "acme", "3"}, `weight k acme: give WEIGHT and DURATION (e.g. 3 10m), or clear (see 'jobthrottle help weight')`},
		{[]string{"weight", "k", "acme", "heavy", "10m"}, `weight k acme: "heavy" is not a positive number (e.g. 3, 0.5)`},
		{[]string{"weight", "k", "acme", "0", "10m"}, `weight k acme: "0" is not a positive number`},
		{[]string{"weight", "k", "acme", "-2", "10m"}, `weight k acme: "-2" is not a positive number`},
		{[]string{"weight", "k", "acme", "2000000", "10m"}, "weight k acme: 2000000 is not a weight from 0.000001 to 1000000"},
		{[]string{"weight", "k", "acme", "0.0000001", "10m"}, "weight k acme: 0.0000001 is not a weight from 0.000001 to 1000000"},
		{[]string{"weight", "k", "acme", "3", "-1m"}, `weight k acme: "-1m" is not a positive duration: the weight lasts that long from now (e.g. 10m, 24h); 'jobthrottle weight k acme clear' ends it`},
		{[]string{"weight", "k", "ten\n7", "3", "soon"}, `weight k "ten\n7": "soon" is not a positive duration`},
		{[]string{"weight", "k", "", "clear"}, "weight k: tenant name of 0 bytes, want 1 to 256"},
	} {
		code, out, errs := runNoRedis(c.args...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, c.want) || !strings.Contains(errs, "(see 'jobthrottle ") {
			t.Errorf("%q: status %d, stdout %q, stderr %q; want 2, nothing, and one line with %q", c.args, code, out, errs, c.want)
		}
	}
}
