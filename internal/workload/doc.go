// Package workload drives the clients of a fault test and keeps what they
// were told, for package history to check: publishers that send unique
// values one at a time and record each outcome (acked at an offset by an
// owner, failed with an error that guarantees nothing was written, or
// unknown), subscribers attached for the whole test that check each shard
// arrives in offset order and keep every record they saw, and the final
// read-back of every shard, through the SDK or from one broker's own
// replica.
//
// It is shared by the end-to-end tests on local processes (internal/e2e)
// and the multi-host ones in Docker (internal/dockertest). Publish runs in
// its caller's goroutine; a Subscriber owns one goroutine, stopped by
// Subscriber.Finish.
package workload
