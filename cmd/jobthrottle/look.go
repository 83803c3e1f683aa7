package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/redis/go-redis/v9"
)

// entry is one key found under a tag: its name, suffix and Redis type, a string's
// text, and, when its type or content is not what jobthrottle writes, why
// (keys.Check's error).
type entry struct {
	name, suffix, typ string
	text              string
	foreign           error
}

// leftAlone is the line that names a foreign key and why the command leaves it alone.
func (e *entry) leftAlone() string {
	return fmt.Sprintf("left alone: %s is not jobthrottle's (%v)", keyText(e.name), e.foreign)
}

// keyset is what lies under one key's tag.
type keyset struct {
	key, tag string
	ours     map[string]*entry // by suffix, bookings included
	foreign  []*entry
}

func (k *keyset) has(s string) bool { return k.ours[s] != nil }

// states returns the suffixes of the algorithms' state keys the tag holds.
func (k *keyset) states() []string {
	var s []string
	for _, a := range keys.States() {
		if k.has(a) {
			s = append(s, a)
		}
	}
	return s
}

// semaphore reports whether the tag holds a semaphore's leases or queue.
func (k *keyset) semaphore() bool {
	return k.has(keys.Leases) || k.has(keys.Queue) || k.has(keys.QueueExpiry)
}

// bookings returns the names of the tag's bookings.
func (k *keyset) bookings() []string {
	var b []string
	for s, e := range k.ours {
		if strings.HasPrefix(s, keys.Booking) {
			b = append(b, e.name)
		}
	}
	slices.Sort(b)
	return b
}

// record returns the key's record; ok is false when it has none of jobthrottle's.
func (k *keyset) record() (r keys.Record, ok bool) {
	if e := k.ours[keys.RecordKey]; e != nil {
		r, err := keys.ParseRecord(e.text) // keys.Check read it already
		return r, err == nil
	}
	return keys.Record{}, false
}

// control returns the key's control key as read (the zero Control when it has none
// of jobthrottle's).
func (k *keyset) control() keys.Control {
	if e := k.ours[keys.ControlKey]; e != nil {
		c, _ := keys.ParseControl(e.text) // keys.Check read it already
		return c
	}
	return keys.Control{}
}

// foreignOf returns the foreign key with suffix s, or nil.
func (k *keyset) foreignOf(s string) *entry {
	for _, e := range k.foreign {
		if e.suffix == s {
			return e
		}
	}
	return nil
}

// sample is how many elements of a list or sorted set examine reads from each end.
const sample = 16

// examine reads the Redis type and the content of each key (a list's or a sorted
// set's first and last elements), in two pipelines, and checks them with
// keys.Check. Keys that do not exist are left out.
func (t *tool) examine(ctx context.Context, names, suffixes []string) ([]*entry, error) {
	if len(names) == 0 {
		return nil, nil
	}
	pipe := t.rdb.Pipeline()
	types := make([]*redis.StatusCmd, len(names))
	for i, n := range names {
		types[i] = pipe.Type(ctx, n)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	pipe = t.rdb.Pipeline()
	reads := make([][]redis.Cmder, len(names))
	for i, n := range names {
		switch types[i].Val() {
		case "string":
			reads[i] = []redis.Cmder{pipe.Get(ctx, n)}
		case "list":
			reads[i] = []redis.Cmder{pipe.LRange(ctx, n, 0, sample-1), pipe.LRange(ctx, n, -sample, -1)}
		case "zset":
			reads[i] = []redis.Cmder{pipe.ZRangeWithScores(ctx, n, 0, sample-1), pipe.ZRangeWithScores(ctx, n, -sample, -1)}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var found []*entry
	for i, n := range names {
		e := &entry{name: n, suffix: suffixes[i], typ: types[i].Val()}
		if e.typ == "none" {
			continue
		}
		var values []string
		gone := false
		for _, c := range reads[i] {
			switch c := c.(type) {
			case *redis.StringCmd:
				e.text, gone = c.Val(), errors.Is(c.Err(), redis.Nil) // expired since TYPE
				values = append(values, e.text)
			case *redis.StringSliceCmd:
				values = append(values, c.Val()...)
			case *redis.ZSliceCmd:
				for _, z := range c.Val() {
					values = append(values, fmt.Sprint(z.Member), strconv.FormatFloat(z.Score, 'f', -1, 64))
				}
			}
		}
		if !gone {
			e.foreign = keys.Check(e.suffix, e.typ, values)
			found = append(found, e)
		}
	}
	return found, nil
}

// tagOf is key's hash tag under the prefix.
func (t *tool) tagOf(key string) (string, error) {
	tag, err := keys.Tag(t.o.prefix, key)
	if err != nil {
		return "", fmt.Errorf("key %q: %v", key, err)
	}
	return tag, nil
}

// look examines what lies under key's tag: every key of keys.Suffixes, and, with
// bookings, the tasks' bookings SCAN finds there.
func (t *tool) look(ctx context.Context, key string, bookings bool) (*keyset, error) {
	tag, err := t.tagOf(key)
	if err != nil {
		return nil, err
	}
	suffixes := keys.Suffixes()
	if bookings {
		names, err := t.scan(ctx, escapeGlob(keys.Name(tag, keys.Booking))+"*", tag)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if k, s, ok := keys.Split(t.o.prefix, n); ok && k == key {
				suffixes = append(suffixes, s)
			}
		}
	}
	names := make([]string, len(suffixes))
	for i, s := range suffixes {
		names[i] = keys.Name(tag, s)
	}
	found, err := t.examine(ctx, names, suffixes)
	if err != nil {
		return nil, err
	}
	return group(found, map[string]string{tag: key})[key], nil
}

// group sorts entries into keysets by key (byTag: each tag's key); a key with no
// entry gets an empty keyset.
func group(found []*entry, byTag map[string]string) map[string]*keyset {
	sets := map[string]*keyset{}
	for tag, key := range byTag {
		sets[key] = &keyset{key: key, tag: tag, ours: map[string]*entry{}}
	}
	for _, e := range found {
		k := sets[byTag[strings.TrimSuffix(e.name, ":"+e.suffix)]]
		if e.foreign != nil {
			k.foreign = append(k.foreign, e)
		} else {
			k.ours[e.suffix] = e
		}
	}
	return sets
}

// scan returns the names of the keys that match the glob: on every node of a
// cluster, or, with tag, on the node that holds tag's slot only.
func (t *tool) scan(ctx context.Context, match, tag string) ([]string, error) {
	var names []string
	var mu sync.Mutex // ForEachMaster runs the nodes at once
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, match, 1000).Iterator()
		for it.Next(ctx) {
			mu.Lock()
			names = append(names, it.Val())
			mu.Unlock()
		}
		return it.Err()
	}
	switch c := t.rdb.(type) {
	case *redis.ClusterClient:
		if tag != "" {
			n, err := c.MasterForKey(ctx, tag)
			if err != nil {
				return nil, err
			}
			return names, scan(ctx, n)
		}
		return names, c.ForEachMaster(ctx, scan)
	case *redis.Client:
		return names, scan(ctx, c)
	}
	return nil, fmt.Errorf("a client of type %T cannot SCAN", t.rdb)
}

// escapeGlob quotes the glob characters of s for SCAN MATCH.
func escapeGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}

// serverNow is the Redis server's clock, µs: the clock the control key's ends are
// written by.
func (t *tool) serverNow(ctx context.Context) (int64, error) {
	now, err := t.rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return now.UnixMicro(), nil
}

// left is the time from now until end (µs of the server's clock), at least 0.
func left(end, now int64) time.Duration {
	return max(0, time.Duration(end-now)*time.Microsecond)
}
