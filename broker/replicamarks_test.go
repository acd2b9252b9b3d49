package broker

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/felix-broker/felix/shardmap"
)

func openMarks(t testing.TB, dir string) *replicaMarks {
	t.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	m, err := loadReplicaMarks(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.close)
	return m
}

func marksFile(t *testing.T, dir string) (lines []string, inode uint64) {
	t.Helper()
	path := filepath.Join(dir, replicaMarksFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		inode = st.Ino
	}
	return strings.SplitAfter(string(b), "\n"), inode
}

func shardID(stream string, shard int) shardmap.ShardID {
	return shardmap.ShardID{Stream: stream, Shard: shard}
}

// TestReplicaMarksAppend: after the file exists, each mark is one line
// appended to it (the same file, one line longer), not a rewrite of the
// whole file; the marks survive a reload.
func TestReplicaMarksAppend(t *testing.T) {
	dir := t.TempDir()
	m := openMarks(t, dir)
	if err := m.add(shardID("orders", 0)); err != nil {
		t.Fatal(err)
	}
	_, first := marksFile(t, dir)
	for i := 1; i < 50; i++ {
		if err := m.add(shardID("orders", i)); err != nil {
			t.Fatal(err)
		}
		lines, ino := marksFile(t, dir)
		if want := fmt.Sprintf("orders/%d\n", i); len(lines) != i+2 || lines[i] != want {
			t.Fatalf("after mark %d the file is %q, want it to end with the line %q", i, lines, want)
		}
		if ino != first {
			t.Fatalf("mark %d replaced the file (inode %d, was %d): want an append", i, ino, first)
		}
	}
	if err := m.add(shardID("orders", 7)); err != nil { // already marked: nothing written
		t.Fatal(err)
	}
	if lines, _ := marksFile(t, dir); len(lines) != 51 {
		t.Fatalf("a mark added twice was written twice: %d lines", len(lines)-1)
	}

	again := openMarks(t, dir)
	for i := range 50 {
		if !again.has(shardID("orders", i)) {
			t.Fatalf("orders/%d not marked after reload", i)
		}
	}
	if again.has(shardID("orders", 50)) {
		t.Fatal("orders/50 marked, never added")
	}
}

// TestReplicaMarksTornAppend: a crash in the middle of an append leaves a
// last line without its newline. That mark's add never returned, so it
// does not count; the next mark rewrites the file, so the partial line
// never runs into it.
func TestReplicaMarksTornAppend(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, replicaMarksFile), []byte("a/0\nb/1\nc/1"), 0o640); err != nil {
		t.Fatal(err)
	}
	m := openMarks(t, dir)
	if !m.has(shardID("a", 0)) || !m.has(shardID("b", 1)) {
		t.Fatal("complete lines before a torn one are not marks")
	}
	if m.has(shardID("c", 1)) || m.has(shardID("c", 12)) {
		t.Fatal("a torn last line counts as a mark")
	}
	if err := m.add(shardID("c", 12)); err != nil {
		t.Fatal(err)
	}
	lines, _ := marksFile(t, dir)
	if want := []string{"a/0\n", "b/1\n", "c/12\n", ""}; !slices.Equal(lines, want) {
		t.Fatalf("file after a torn append and a new mark: %q, want %q", lines, want)
	}
	again := openMarks(t, dir)
	if !again.has(shardID("c", 12)) || again.has(shardID("c", 1)) {
		t.Fatal("after reload: the new mark is missing, or the torn one counts")
	}
}

// TestReplicaMarksRemoveStream: removing a stream's marks rewrites the
// file without them, and later marks are appended to the new file (not to
// the one it replaced).
func TestReplicaMarksRemoveStream(t *testing.T) {
	dir := t.TempDir()
	m := openMarks(t, dir)
	for _, id := range []shardmap.ShardID{shardID("a", 0), shardID("ab", 0), shardID("a", 1), shardID("b", 0)} {
		if err := m.add(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.removeStream("a"); err != nil {
		t.Fatal(err)
	}
	if m.has(shardID("a", 0)) || m.has(shardID("a", 1)) || !m.has(shardID("ab", 0)) || !m.has(shardID("b", 0)) {
		t.Fatal("removeStream(a) removed the wrong marks")
	}
	if err := m.add(shardID("c", 3)); err != nil {
		t.Fatal(err)
	}
	again := openMarks(t, dir)
	for id, want := range map[shardmap.ShardID]bool{shardID("a", 0): false, shardID("a", 1): false, shardID("ab", 0): true, shardID("b", 0): true, shardID("c", 3): true} {
		if again.has(id) != want {
			t.Errorf("after reload, %s marked: %v, want %v", id, !want, want)
		}
	}
}

// BenchmarkReplicaMarksAdd is the cost of marking one more replica when
// the broker already holds n: constant with appends (it grew with n when
// each mark rewrote the whole file).
func BenchmarkReplicaMarksAdd(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("held=%d", n), func(b *testing.B) {
			m := openMarks(b, b.TempDir())
			for i := range n {
				if err := m.add(shardID("held", i)); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				if err := m.add(shardID("new", i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
