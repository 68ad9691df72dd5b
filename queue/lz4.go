package queue

import (
	"io"
	"sync"

	"github.com/pierrec/lz4/v4"
	"github.com/segmentio/kafka-go/compress"
	kafkalz4 "github.com/segmentio/kafka-go/compress/lz4"
)

// lz4Codec is kafka-go's lz4 codec writing frames of 64 KiB blocks, the
// block size of Kafka's own Java client, instead of pierrec/lz4's default
// of 4 MiB: a producer compressing several partitions' batches at once then
// holds a few buffers of 64 KiB, not of 4 MiB each (28 MB for a bulk load's
// six partitions), and consumers size their buffers by the frames they
// read. Reading is kafka-go's (any block size).
type lz4Codec struct {
	kafkalz4.Codec
	writers sync.Pool
}

func (c *lz4Codec) NewWriter(w io.Writer) io.WriteCloser {
	z, _ := c.writers.Get().(*lz4.Writer)
	if z == nil {
		z = lz4.NewWriter(w)
		// The options are valid for a new writer, and Reset keeps them.
		_ = z.Apply(lz4.BlockSizeOption(lz4.Block64Kb))
	} else {
		z.Reset(w)
	}
	return &lz4Writer{z: z, pool: &c.writers}
}

type lz4Writer struct {
	z    *lz4.Writer
	pool *sync.Pool
}

func (w *lz4Writer) Write(p []byte) (int, error) { return w.z.Write(p) }

func (w *lz4Writer) Close() error {
	if w.z == nil {
		return nil
	}
	err := w.z.Close()
	w.z.Reset(nil)
	w.pool.Put(w.z)
	w.z = nil
	return err
}

// init installs lz4Codec in kafka-go's codec table, before any Kafka
// connection of the process can use it (the table is read, never written,
// by kafka-go's goroutines).
func init() {
	compress.Codecs[compress.Lz4] = &lz4Codec{}
}
