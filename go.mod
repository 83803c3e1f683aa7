module github.com/jobthrottle/jobthrottle

go 1.24.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/hibiken/asynq v0.26.0
	github.com/redis/go-redis/v9 v9.22.0
	golang.org/x/time v0.14.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/spf13/cast v1.10.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.37.0 // indirect
	google.golang.org/protobuf v1.36.10 // indirect
)
