// Package e2e holds the end-to-end tests: real `felix broker` processes
// started by the cluster harness, driven through the Go SDK over real QUIC,
// killed and restarted for real. It has no code of its own.
package e2e
