// Package asynqmw keeps asynq task handlers inside rate and in-flight limits shared
// through Redis, without losing, failing or archiving a task because it was throttled.
package asynqmw
