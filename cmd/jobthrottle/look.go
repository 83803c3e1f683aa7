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

// entry is one key found under a tag: its name, suffix and Redis type and, when its
// type or content is not what jobthrottle writes, why (keys.Check's error). A
// limiter's state (suffix keys.State) of jobthrottle's carries its meta.
type entry struct {
	name, suffix, typ string
	meta              *keys.Meta // the state's meta; nil for other keys
	rawMeta           string     // its text
	bare              bool       // the state holds its meta alone: nothing is counted
	foreign           error
}

// leftAlone is the line that names a foreign key and why the command leaves it alone.
func (e *entry) leftAlone() string {
	return fmt.Sprintf("left alone: %s is not jobthrottle's (%v)", keyText(e.name), e.foreign)
}

// keyset is what lies under one key's tag.
type keyset struct {
	key, tag string
	ours     map[string]*entry // by suffix, bookings and tenants' states included
	foreign  []*entry
}

func (k *keyset) has(s string) bool { return k.ours[s] != nil }

// meta returns the meta of the key's state (the zero Meta when it has none of
// jobthrottle's): what is set on the key, its head and the fair share's clock.
func (k *keyset) meta() keys.Meta {
	if e := k.ours[keys.State]; e != nil {
		return *e.meta
	}
	return keys.Meta{}
}

// head returns the head the key's meta holds; ok is false when it has none.
func (k *keyset) head() (h keys.Head, ok bool) {
	if e := k.ours[keys.State]; e != nil {
		h, err := keys.ParseHead(e.meta.Head) // keys.Check read it already
		return h, err == nil
	}
	return keys.Head{}, false
}

// record returns the key's record: the algorithm and limits of its state's head, as
// its last writer had them; ok is false when it has none (no state, or a meta alone
// this command wrote on a key with none, whose head is unknown).
func (k *keyset) record() (h keys.Head, ok bool) {
	h, ok = k.head()
	if !ok || h.String() == unknown.String() {
		return keys.Head{}, false
	}
	return h, true
}

// idle reports whether the key's state holds its meta alone: nothing is counted.
func (k *keyset) idle() bool {
	e := k.ours[keys.State]
	return e == nil || e.bare
}

// semaphore reports whether the tag holds a semaphore's leases or queue.
func (k *keyset) semaphore() bool {
	return k.has(keys.Leases) || k.has(keys.Queue) || k.has(keys.QueueExpiry)
}

// named returns the names of the tag's keys whose suffix begins with s (bookings,
// tenants' states), sorted.
func (k *keyset) named(s string) []string {
	var b []string
	for suffix, e := range k.ours {
		if strings.HasPrefix(suffix, s) {
			b = append(b, e.name)
		}
	}
	slices.Sort(b)
	return b
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

// fixed are the suffixes of the keys a tag may hold besides bookings and tenants'
// states.
var fixed = []string{keys.State, keys.FairQueue, keys.Leases, keys.Queue, keys.QueueExpiry}

// sample is how many elements of a list or sorted set examine reads, from its start:
// a state's meta and the first numbers of its log, the first members of a queue.
const sample = 32

// examine reads the Redis type and the content of each key (a list's or a sorted
// set's first elements), in two pipelines, and checks them with keys.Check. Keys that
// do not exist are left out.
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
	reads := make([]redis.Cmder, len(names))
	for i, n := range names {
		switch types[i].Val() {
		case "string":
			reads[i] = pipe.Get(ctx, n)
		case "list":
			reads[i] = pipe.LRange(ctx, n, 0, sample-1)
		case "zset":
			reads[i] = pipe.ZRangeWithScores(ctx, n, 0, sample-1)
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
		switch c := reads[i].(type) {
		case *redis.StringCmd:
			if c.Err() == nil {
				values = []string{c.Val()}
			}
		case *redis.StringSliceCmd:
			values = c.Val()
		case *redis.ZSliceCmd:
			for _, z := range c.Val() {
				values = append(values, fmt.Sprint(z.Member), strconv.FormatFloat(z.Score, 'f', -1, 64))
			}
		}
		if reads[i] != nil && len(values) == 0 { // expired since TYPE
			continue
		}
		if e.foreign = keys.Check(e.suffix, e.typ, values); e.foreign == nil && e.suffix == keys.State {
			e.readMeta(values)
		}
		found = append(found, e)
	}
	return found, nil
}

// readMeta reads the meta of a state keys.Check took as jobthrottle's, from values as
// examine read them: a list's first element, or a string's text after its numbers.
func (e *entry) readMeta(values []string) {
	text := values[0]
	if e.typ == "string" {
		var nums string
		nums, text, _ = strings.Cut(text, "\n")
		e.bare = nums == ""
	} else {
		e.bare = len(values) == 1
	}
	m, _ := keys.ParseMeta(text) // keys.Check read it
	e.meta, e.rawMeta = &m, text
}

// tagOf is key's hash tag under the prefix.
func (t *tool) tagOf(key string) (string, error) {
	tag, err := keys.Tag(t.o.prefix, key)
	if err != nil {
		return "", fmt.Errorf("key %q: %v", key, err)
	}
	return tag, nil
}

// look examines what lies under key's tag: the fixed keys, and, with all, every key
// SCAN finds there (the tasks' bookings, the tenants' states).
func (t *tool) look(ctx context.Context, key string, all bool) (*keyset, error) {
	tag, err := t.tagOf(key)
	if err != nil {
		return nil, err
	}
	suffixes := slices.Clone(fixed)
	if all {
		names, err := t.scan(ctx, escapeGlob(tag)+":*", tag)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if k, s, ok := keys.Split(t.o.prefix, n); ok && k == key && !slices.Contains(fixed, s) {
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

// serverNow is the Redis server's clock, µs: the clock the meta's ends are written by.
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
