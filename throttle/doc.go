// Package throttle provides rate limiters and in-flight limits shared through Redis.
package throttle
