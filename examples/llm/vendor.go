package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// vendor is a fake LLM API. It answers a completion whose output is 10–100 % of the
// request's max_tokens, taking tokenTime per output token (streamed in a few events
// when asked), and enforces its limits on the actual tokens as a strict sliding
// window: a request that would take any limit over within the last period is refused
// with 429 and the vendor's rate-limit headers. It counts a request's tokens when the
// request arrives, as it decides the answer then. It knows nothing of Redis or of the
// fleet's limiter.
type vendor struct {
	*httptest.Server
	style     string         // "openai" or "anthropic": the headers and usage it writes
	limits    map[string]int // by unit: "requests", and "tokens" or "input-tokens" and "output-tokens"
	period    time.Duration
	tokenTime time.Duration

	mu       sync.Mutex
	window   []charge       // accepted within the last period, oldest first
	accepted map[string]int // by unit, since the start
	refused  int
}

// charge is one accepted request's cost, by unit, and when it arrived.
type charge struct {
	at   time.Time
	cost map[string]int
}

// request is the body the fleet sends; usage what the vendor answers it cost.
type request struct {
	Input     string `json:"input"`
	MaxTokens int    `json:"max_tokens"`
	Stream    bool   `json:"stream"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens,omitempty"` // OpenAI's
	CompletionTokens int `json:"completion_tokens,omitempty"`
	TotalTokens      int `json:"total_tokens,omitempty"`
	InputTokens      int `json:"input_tokens,omitempty"` // Anthropic's
	OutputTokens     int `json:"output_tokens,omitempty"`
}

// countTokens is the vendor's tokenizer, which clients can run too: a token per 4 bytes.
func countTokens(s string) int { return (len(s) + 3) / 4 }

func newVendor(style string, limits map[string]int, period, tokenTime time.Duration) *vendor {
	v := &vendor{style: style, limits: limits, period: period, tokenTime: tokenTime, accepted: map[string]int{}}
	v.Server = httptest.NewServer(http.HandlerFunc(v.serve))
	return v
}

func (v *vendor) serve(w http.ResponseWriter, r *http.Request) {
	var req request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.MaxTokens < 1 {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	in := countTokens(req.Input)
	out := req.MaxTokens/10 + rand.IntN(req.MaxTokens-req.MaxTokens/10+1)
	u := usage{PromptTokens: in, CompletionTokens: out, TotalTokens: in + out}
	cost := map[string]int{"requests": 1, "tokens": in + out}
	if v.style == "anthropic" {
		u = usage{InputTokens: in, OutputTokens: out}
		cost = map[string]int{"requests": 1, "input-tokens": in, "output-tokens": out}
	}
	if !v.admit(w.Header(), cost) {
		http.Error(w, `{"error":{"type":"rate_limit_error"}}`, http.StatusTooManyRequests)
		return
	}
	time.Sleep(time.Duration(out) * v.tokenTime) // generating
	usageJSON, _ := json.Marshal(u)
	if !req.Stream {
		fmt.Fprintf(w, `{"content":"%s","usage":%s}`, strings.Repeat("word ", out/4), usageJSON)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for range 4 {
		fmt.Fprintf(w, "data: {\"delta\":\"%s\"}\n\n", strings.Repeat("word ", out/16))
		w.(http.Flusher).Flush()
	}
	fmt.Fprintf(w, "data: {\"usage\":%s}\n\ndata: [DONE]\n\n", usageJSON) // the final event
}

// admit accepts cost if every limit has room for it within the last period, and
// writes the rate-limit headers (with Retry-After when it refuses).
func (v *vendor) admit(h http.Header, cost map[string]int) bool {
	now := time.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	for len(v.window) > 0 && now.Sub(v.window[0].at) >= v.period {
		v.window = v.window[1:]
	}
	used := map[string]int{}
	for _, c := range v.window {
		for unit, n := range c.cost {
			used[unit] += n
		}
	}
	var wait time.Duration // until the oldest charges that make room for cost have left
	for unit, limit := range v.limits {
		over := used[unit] + cost[unit] - limit
		for i := 0; over > 0 && i < len(v.window); i++ {
			over -= v.window[i].cost[unit]
			wait = max(wait, v.window[i].at.Add(v.period).Sub(now))
		}
	}
	ok := wait == 0
	if ok {
		v.window = append(v.window, charge{now, cost})
		for unit, n := range cost {
			v.accepted[unit] += n
			used[unit] += n
		}
	} else {
		v.refused++
		h.Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
	}
	var full time.Duration // until the window is empty: the quotas are full again
	if len(v.window) > 0 {
		full = v.window[len(v.window)-1].at.Add(v.period).Sub(now)
	}
	for unit, limit := range v.limits {
		left := strconv.Itoa(limit - used[unit])
		if v.style == "anthropic" {
			h.Set("anthropic-ratelimit-"+unit+"-limit", strconv.Itoa(limit))
			h.Set("anthropic-ratelimit-"+unit+"-remaining", left)
			h.Set("anthropic-ratelimit-"+unit+"-reset", now.Add(full+time.Second-1).UTC().Format(time.RFC3339)) // whole seconds, rounded up
			continue
		}
		h.Set("x-ratelimit-limit-"+unit, strconv.Itoa(limit))
		h.Set("x-ratelimit-remaining-"+unit, left)
		h.Set("x-ratelimit-reset-"+unit, full.Round(time.Millisecond).String())
	}
	return ok
}

// totals returns what the vendor accepted, by unit, and how many requests it refused.
func (v *vendor) totals() (map[string]int, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	acc := map[string]int{}
	for unit, n := range v.accepted {
		acc[unit] = n
	}
	return acc, v.refused
}
