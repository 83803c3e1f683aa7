package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// redisError is a failed call to Redis at where (an address, or several for a
// cluster) that could not be made at all, or was refused.
type redisError struct {
	where string
	cmd   string // the command the CLI sent ("ping")
	err   error
}

func (e *redisError) Error() string { return e.cmd + " at " + e.where + ": " + e.err.Error() }
func (e *redisError) Unwrap() error { return e.err }

// Redis's refusals, as Redis 6.2 to 7.x word them.
var (
	nopermCommand = regexp.MustCompile(`no permissions to run the '([^']+)' command`)
	nopermKey     = regexp.MustCompile(`no permissions to access one of the keys`)
	nopermChannel = regexp.MustCompile(`no permissions to access one of the channels`)
	nopermScript  = regexp.MustCompile(`user executing the script can't run this command`)
)

// describe is err as the command prints it, one line: a permission Redis refused
// names NOPERM and the ACL rule missing; Redis not reached says where it was looked
// for; a refused login says so.
func describe(err error, prefix string) string {
	text := err.Error()
	var re *redisError
	where := ""
	if errors.As(err, &re) {
		where = " at " + re.where
		text = re.err.Error()
	}
	text = strings.ReplaceAll(text, "jobthrottle: ", "") // the library's errors say it too: say it once
	switch {
	case strings.Contains(text, "NOPERM") || nopermScript.MatchString(text) || errors.Is(err, throttle.ErrNoPermission):
		rule := "a rule of jobthrottle's"
		switch m := nopermCommand.FindStringSubmatch(text); {
		case m != nil:
			rule = "+" + m[1]
		case nopermKey.MatchString(text):
			rule = "access to the keys (~{" + prefix + "*)"
		case nopermChannel.MatchString(text):
			rule = "access to the channels (&{" + prefix + "*)"
		case nopermScript.MatchString(text):
			rule = "a command jobthrottle's scripts run (Redis does not say which)"
		}
		return fmt.Sprintf("NOPERM: the Redis user lacks %s (%s); 'jobthrottle help acl' gives the rules it needs", rule, oneLine(text))
	case strings.Contains(text, "WRONGPASS") || strings.Contains(text, "NOAUTH"):
		return fmt.Sprintf("Redis%s refused the login: %s (the user and password come from -a and --user, REDISCLI_AUTH, or -u/REDIS_URL)", where, oneLine(text))
	case unreachable(err):
		if where == "" {
			return "lost Redis: " + oneLine(text)
		}
		return fmt.Sprintf("cannot reach Redis%s: %s", where, oneLine(text))
	}
	if where != "" {
		return fmt.Sprintf("Redis%s: %s", where, oneLine(text))
	}
	return oneLine(text)
}

// unreachable reports whether err says Redis was not reached or did not answer.
func unreachable(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &op) || errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, throttle.ErrUnavailable)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
