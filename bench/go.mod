module github.com/jobthrottle/jobthrottle/bench

go 1.24.0

require (
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/jobthrottle/jobthrottle v0.0.0
	github.com/redis/go-redis/v9 v9.22.0
)

require (
	github.com/alicebob/miniredis/v2 v2.40.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.37.0 // indirect
)

replace github.com/jobthrottle/jobthrottle => ../
