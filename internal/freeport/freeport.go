// Package freeport picks ports for servers that must find their port
// free again when they restart: a broker's QUIC port, the control
// plane's, and the embedded etcd's client and peer ports, which are
// recorded at a first start and listened on at every later one.
//
// A port the kernel hands out for ":0" lies in its ephemeral range, the
// range it also draws from for every socket that binds no port of its
// own (each outgoing TCP connection, each QUIC client). Killed and
// restarted on such a port, a server can find it taken by someone's
// connection meanwhile and fail "address already in use": felix dev
// killed -9 did so once in a full test run, its etcd's recorded client
// port taken. So the ports picked here lie below that range (from 10000
// up), where only a socket that asks for the port by number gets it.
// Outside Linux, or where the range leaves no room below it, the kernel
// picks.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Min is the lowest port picked below the ephemeral range.
const Min = 10000

// UDP returns a UDP port on host that was free a moment ago.
func UDP(host string) (int, error) {
	ports, err := pick(host, 1, func(addr string) (func(), int, error) {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, 0, err
		}
		return func() { pc.Close() }, pc.LocalAddr().(*net.UDPAddr).Port, nil
	})
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// TCP returns n distinct TCP ports on host that were free a moment ago:
// all n are held open together while they are picked, so no two picks
// return the same port.
func TCP(host string, n int) ([]int, error) {
	return pick(host, n, func(addr string) (func(), int, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, 0, err
		}
		return func() { ln.Close() }, ln.Addr().(*net.TCPAddr).Port, nil
	})
}

// listenFunc binds addr and returns how to release it and the port it
// bound.
type listenFunc func(addr string) (release func(), port int, err error)

// pick returns n ports that listen found free, each held until all are
// picked.
func pick(host string, n int, listen listenFunc) ([]int, error) {
	low := EphemeralLow()
	ports := make([]int, 0, n)
	for range n {
		release, port, err := pickOne(host, low, listen)
		if err != nil {
			return nil, err
		}
		defer release()
		ports = append(ports, port)
	}
	return ports, nil
}

// pickOne binds a port below low (the ephemeral range's first) where
// there is room, else the one the kernel picks.
func pickOne(host string, low int, listen listenFunc) (func(), int, error) {
	if low > Min+1000 {
		for range 200 {
			release, port, err := listen(net.JoinHostPort(host, strconv.Itoa(Min+rand.IntN(low-Min))))
			if err == nil {
				return release, port, nil
			}
		}
	}
	release, port, err := listen(net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, 0, fmt.Errorf("freeport: find a free port on %s: %w", host, err)
	}
	return release, port, nil
}

// EphemeralLow returns the first port of the kernel's ephemeral range
// (Linux: net.ipv4.ip_local_port_range), 0 if it cannot tell.
func EphemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}
