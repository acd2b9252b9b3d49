package tmpdeps

import (
	_ "github.com/HdrHistogram/hdrhistogram-go"
	_ "github.com/alecthomas/kong"
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/quic-go/quic-go"
	_ "github.com/tidwall/wal"
	_ "github.com/vmihailenco/msgpack/v5"
	_ "go.uber.org/goleak"
)
