package tidseg

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFdatasyncHandOff: a handed-off fdatasync of a written file succeeds,
// over and over, from several goroutines at once at GOMAXPROCS=1 while
// others keep the scheduler busy (the P passes back and forth around every
// call; under -race the detector sees no call made without a P); what
// fdatasync refuses comes back as the kernel's error.
func TestFdatasyncHandOff(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	dir := t.TempDir()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var spins sync.WaitGroup
	for range 2 { // goroutines that want the P while the syncs block
		spins.Go(func() {
			ping := make(chan int)
			go func() {
				for v := range ping {
					_ = v
				}
			}()
			defer close(ping)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case ping <- i:
				}
			}
		})
	}
	for g := range 4 {
		wg.Go(func() {
			f, err := os.Create(filepath.Join(dir, fmt.Sprint(g)))
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			for i := range 50 {
				if _, err := fmt.Fprintf(f, "record %d\n", i); err != nil {
					t.Error(err)
					return
				}
				if err := FdatasyncHandOff(f); err != nil {
					t.Errorf("file %d, fdatasync %d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	spins.Wait()
	for g := range 4 {
		data, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(g)))
		if err != nil || len(data) != len("record 0\n")*10+len("record 10\n")*40 {
			t.Fatalf("file %d: read back %d bytes: %v", g, len(data), err)
		}
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := FdatasyncHandOff(w); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("fdatasync of a pipe: %v, want EINVAL", err)
	}
	f, err := os.Create(filepath.Join(dir, "closed"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := FdatasyncHandOff(f); err == nil {
		t.Fatal("fdatasync of a closed file succeeded")
	}
}

// BenchmarkEchoDuringFdatasync is what the rest of a process gets while
// one of its goroutines commits to a file again and again (a broker's
// shard under load): a UDP round trip between two sockets of the process
// (its network input, through the runtime's poller), timed per op, with
// the committer's fdatasync blocking (keeping its P), handed off, or
// parked. Run it with -cpu 1: a broker of a local cluster runs at
// GOMAXPROCS=1, where a blocking fdatasync leaves the echo waiting for the
// disk.
func BenchmarkEchoDuringFdatasync(b *testing.B) {
	for _, mode := range []string{"none", "blocking", "handoff", "parked"} {
		b.Run(mode, func(b *testing.B) {
			echo, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				b.Fatal(err)
			}
			c, err := net.DialUDP("udp", nil, echo.LocalAddr().(*net.UDPAddr))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			var wg sync.WaitGroup
			wg.Go(func() {
				buf := make([]byte, 64)
				for {
					n, from, err := echo.ReadFromUDPAddrPort(buf)
					if err != nil {
						return
					}
					if _, err := echo.WriteToUDPAddrPort(buf[:n], from); err != nil {
						return
					}
				}
			})
			stop := make(chan struct{})
			if mode != "none" {
				f, err := os.Create(filepath.Join(b.TempDir(), "seg"))
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				var s *ParkedSyncer
				if mode == "parked" {
					s = newParked(b)
				}
				wg.Go(func() {
					rec := make([]byte, 200)
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := commitBy(mode, s, f, rec); err != nil {
							b.Error(err)
							return
						}
					}
				})
				time.Sleep(10 * time.Millisecond) // the committer is busy
			}
			msg, buf := make([]byte, 32), make([]byte, 64)
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Read(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			close(stop)
			echo.Close()
			wg.Wait()
		})
	}
}
