package bulkload

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/klauspost/pgzip"

	"github.com/sluicehq/sluice/ingest"
)

// Stdin is the input name of standard input.
const Stdin = "-"

// stdinName is how errors and dead letters name standard input.
const stdinName = "stdin"

// Compression of an input (InputConfig.Compression).
const (
	CompressionAuto = "auto" // by the extension (.gz, .zst, .zstd), else by the stream's first bytes
	CompressionNone = "none"
	CompressionGzip = "gzip"
	CompressionZstd = "zstd"
)

// zstdMaxWindow is the largest zstd window an input may use: 128 MiB
// (zstd's levels use at most 8 MiB; --ultra -22 uses 128 MiB).
const zstdMaxWindow = 128 << 20

// ErrNoIdentity is returned by Input.Digest when the input cannot be read
// twice (standard input), so a load of it has no identity to resume by.
var ErrNoIdentity = errors.New("bulkload: standard input cannot be read again, so a load of it cannot resume")

// SettingError is an InputConfig field that does not fit the inputs:
// Setting names the field ("Format", "Compression" or "IDField") so that a
// caller can name its own setting for it, and Err says what is wrong
// (naming the input when one input is the cause).
type SettingError struct {
	Setting string
	Err     error
}

func (e *SettingError) Error() string { return fmt.Sprintf("bulkload: %s: %v", e.Setting, e.Err) }

func (e *SettingError) Unwrap() error { return e.Err }

// InputConfig configures Open.
type InputConfig struct {
	// Format is "csv", "ndjson" or "" (each file's from its extension:
	// .csv, .ndjson or .jsonl, before any .gz, .zst or .zstd). Standard
	// input needs it.
	Format string
	// Compression is CompressionAuto (the default), CompressionNone,
	// CompressionGzip or CompressionZstd, for every input.
	Compression string
	// IDField names the ID column or field (see ingest.RecordID).
	IDField string
	// CSV says which JSON types CSV fields become. Default: strings.
	CSV CSVTypes
	// Validate, when set, checks each record's JSON value (a record type's
	// schema, say); a record it refuses is a malformed row.
	Validate func(value []byte) error
	// Stdin is what Stdin reads. Default os.Stdin.
	Stdin io.Reader
	// MaxRowBytes is the longest row an input may have. Default
	// DefaultMaxRowBytes (16 MiB).
	MaxRowBytes int
}

// Input streams the records of one or more inputs as one: files, the
// files a glob matches, the data files of a directory, or standard input,
// each CSV or NDJSON, each plain, gzip- or zstd-compressed. It reads as it
// goes: memory holds a row and the read buffers (about 1 MiB), whatever
// the inputs' sizes, and lines are counted on the way, so every malformed
// row is named by file:line. Files are opened one at a time, in order.
// Input implements Rows.
type Input struct {
	cfg   InputConfig
	names []string // as given after expansion; Stdin for standard input
	i     int      // the input being read
	cur   *fileReader
	stdin *fileReader // opened by Fields before reading started
}

// OpenFile opens one file (format "" from its extension); see Open.
func OpenFile(path, format, idField string) (*Input, error) {
	return Open([]string{path}, InputConfig{Format: format, IDField: idField})
}

// Open expands names — files, globs (path/filepath.Match syntax; like a
// shell's, they skip directories and, unless the pattern starts with a
// dot, dot-files), directories (their .csv, .ndjson and .jsonl files, compressed or not,
// in name order; not their subdirectories) and Stdin — checks that each
// file exists and that its format can be told, and opens the first (see
// CheckFields for the others). Errors
// name the input; one about cfg (a format or compression that is unknown,
// cannot be told or does not fit) is a *SettingError naming the field.
func Open(names []string, cfg InputConfig) (*Input, error) {
	cfg.Compression = strings.ToLower(cfg.Compression)
	switch cfg.Compression {
	case "":
		cfg.Compression = CompressionAuto
	case CompressionAuto, CompressionNone, CompressionGzip, CompressionZstd:
	default:
		return nil, &SettingError{Setting: "Compression", Err: fmt.Errorf("want auto, none, gzip or zstd, got %q", cfg.Compression)}
	}
	switch cfg.Format {
	case "", "csv", "ndjson":
	default:
		return nil, &SettingError{Setting: "Format", Err: fmt.Errorf("want csv or ndjson, got %q", cfg.Format)}
	}
	if cfg.MaxRowBytes <= 0 {
		cfg.MaxRowBytes = DefaultMaxRowBytes
	}
	if cfg.Stdin == nil {
		cfg.Stdin = os.Stdin
	}
	if len(names) == 0 {
		return nil, errors.New("no input given: name files, globs, directories or - (standard input)")
	}
	in := &Input{cfg: cfg}
	seen := map[string]bool{}
	for _, name := range names {
		expanded, err := expand(name, cfg.Format)
		if err != nil {
			return nil, err
		}
		for _, n := range expanded {
			key := n
			if n != Stdin {
				key, _ = filepath.Abs(n)
			}
			if seen[key] {
				return nil, fmt.Errorf("%s: named twice in the inputs", n)
			}
			seen[key] = true
			if _, err := formatOf(n, cfg.Format); err != nil {
				return nil, err
			}
			in.names = append(in.names, n)
		}
	}
	first, err := in.open(0)
	if err != nil {
		return nil, err
	}
	in.cur = first
	return in, nil
}

// expand returns the inputs name stands for.
func expand(name, format string) ([]string, error) {
	if name == Stdin {
		if format == "" {
			return nil, &SettingError{Setting: "Format", Err: errors.New("standard input (-): cannot tell its format; set it to csv or ndjson")}
		}
		return []string{Stdin}, nil
	}
	if strings.ContainsAny(name, "*?[") {
		if _, err := os.Stat(name); err != nil { // not a file whose name has those characters
			matches, err := filepath.Glob(name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			var out []string
			hidden := strings.HasPrefix(filepath.Base(name), ".")
			for _, m := range matches {
				st, err := os.Stat(m)
				if err != nil {
					return nil, err
				}
				// As a shell does: no directories, and no dot-files
				// unless the pattern names them.
				if st.IsDir() || (strings.HasPrefix(filepath.Base(m), ".") && !hidden) {
					continue
				}
				out = append(out, m)
			}
			if len(out) == 0 {
				return nil, fmt.Errorf("%s: the pattern matches no file", name)
			}
			return out, nil
		}
	}
	st, err := os.Stat(name)
	if err != nil {
		if _, ferr := formatOf(name, format); ferr != nil {
			return nil, ferr
		}
		return nil, err
	}
	if !st.IsDir() {
		return []string{name}, nil
	}
	entries, err := os.ReadDir(name)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if _, err := formatOf(e.Name(), ""); err == nil {
			out = append(out, filepath.Join(name, e.Name()))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: a directory with no .csv, .ndjson or .jsonl file (compressed or not)", name)
	}
	return out, nil
}

// formatOf returns the format of input name: format when given, else from
// the extension under any compression extension.
func formatOf(name, format string) (string, error) {
	if format != "" {
		return format, nil
	}
	base := strings.ToLower(name)
	for _, ext := range []string{".gz", ".zst", ".zstd"} {
		base = strings.TrimSuffix(base, ext)
	}
	switch filepath.Ext(base) {
	case ".csv":
		return "csv", nil
	case ".ndjson", ".jsonl":
		return "ndjson", nil
	}
	return "", &SettingError{Setting: "Format", Err: fmt.Errorf("%s: cannot tell the format from the extension; set it to csv or ndjson", name)}
}

// Names returns the inputs in the order they are read, as errors and dead
// letters name them ("stdin" for standard input).
func (in *Input) Names() []string {
	out := make([]string, len(in.names))
	for i, n := range in.names {
		out[i] = displayName(n)
	}
	return out
}

func displayName(n string) string {
	if n == Stdin {
		return stdinName
	}
	return n
}

// open opens input i.
func (in *Input) open(i int) (*fileReader, error) {
	name := in.names[i]
	if name == Stdin && in.stdin != nil {
		f := in.stdin
		in.stdin = nil
		return f, nil
	}
	var raw io.ReadCloser
	if name == Stdin {
		raw = io.NopCloser(in.cfg.Stdin)
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		raw = f
	}
	src, err := decompress(displayName(name), raw, in.cfg.Compression)
	if err != nil {
		raw.Close()
		return nil, err
	}
	format, _ := formatOf(name, in.cfg.Format)
	f, err := newFileReader(displayName(name), format, src, in.cfg)
	if err != nil {
		src.Close()
		return nil, err
	}
	return f, nil
}

// readCloser closes a decompressor and then its source.
type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

// decompress returns raw decompressed as compression says: by the name's
// extension or, failing that, the stream's magic bytes when it is auto.
func decompress(name string, raw io.ReadCloser, compression string) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(raw, 64<<10)
	if compression == CompressionAuto {
		lower := strings.ToLower(name)
		switch {
		case strings.HasSuffix(lower, ".gz"):
			compression = CompressionGzip
		case strings.HasSuffix(lower, ".zst"), strings.HasSuffix(lower, ".zstd"):
			compression = CompressionZstd
		default:
			magic, _ := br.Peek(4)
			switch {
			case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
				compression = CompressionGzip
			case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
				compression = CompressionZstd
			default:
				compression = CompressionNone
			}
		}
	}
	switch compression {
	case CompressionGzip:
		// pgzip decompresses ahead in a goroutine of its own (4 blocks of
		// 256 KiB), so parsing does not wait for it.
		z, err := pgzip.NewReaderN(br, 256<<10, 4)
		if err != nil {
			return nil, &SettingError{Setting: "Compression", Err: fmt.Errorf("%s: not gzip: %w", name, err)}
		}
		return readCloser{Reader: &nameErrors{name: name, codec: compression, r: z}, close: func() error { return errors.Join(z.Close(), raw.Close()) }}, nil
	case CompressionZstd:
		// Two blocks decoded at once, ahead of the parser.
		z, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return nil, fmt.Errorf("%s: zstd: %w", name, err)
		}
		return readCloser{Reader: &nameErrors{name: name, codec: compression, r: z}, close: func() error { z.Close(); return raw.Close() }}, nil
	}
	return readCloser{Reader: br, close: raw.Close}, nil
}

// nameErrors says which input a decompression error is about.
type nameErrors struct {
	name, codec string
	r           io.Reader
}

func (n *nameErrors) Read(p []byte) (int, error) {
	k, err := n.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("decompress %s as %s: %w", n.name, n.codec, err)
	}
	return k, err
}

// Next returns the next record of the inputs with Value, ID and Key (= ID)
// set, a *RowError for a malformed row (call Next again to go on), or
// io.EOF after the last input's last record. Any other error (an input
// that cannot be opened or read) ends the inputs.
func (in *Input) Next() (ingest.Record, error) {
	for {
		if in.cur == nil {
			if in.i >= len(in.names) {
				return ingest.Record{}, io.EOF
			}
			f, err := in.open(in.i)
			if err != nil {
				in.i = len(in.names)
				return ingest.Record{}, err
			}
			in.cur = f
		}
		rec, err := in.cur.nextRecord()
		if err == io.EOF {
			_ = in.cur.close()
			in.cur = nil
			in.i++
			continue
		}
		return rec, err
	}
}

// Pos returns the input and line of the record Next returned last.
func (in *Input) Pos() (name string, line int) {
	if in.cur == nil {
		return "", 0
	}
	return in.cur.name, in.cur.where
}

// Where returns "name:line" of the record Next returned last.
func (in *Input) Where() string {
	name, line := in.Pos()
	return fmt.Sprintf("%s:%d", name, line)
}

// CheckFields is the preflight of every input: it opens each in turn
// (standard input is peeked at and kept open for Next), reads its CSV
// header or its first NDJSON records, and returns an error naming the
// first input that cannot be opened, has no ID field column, or lacks a
// field of want (see CheckFields), with the fields it has.
func (in *Input) CheckFields(want map[string]string) error {
	for i, name := range in.names {
		var f *fileReader
		switch {
		case i == in.i && in.cur != nil:
			f = in.cur
		default:
			var err error
			if f, err = in.open(i); err != nil {
				return err
			}
		}
		err := CheckFields(f.fields(), want)
		switch {
		case f == in.cur:
		case name == Stdin:
			in.stdin = f
		default:
			_ = f.close()
		}
		if err != nil {
			if len(in.names) > 1 {
				return fmt.Errorf("%s: %w", displayName(name), err)
			}
			return err
		}
	}
	return nil
}

// Digest returns the SHA-256 of the inputs' bytes as stored (a single
// file's is the SHA-256 of its bytes; several files' is that of their
// digests in order): with the topic, the identity of a load (see LoadID).
// It reads every file once more, before the load; ErrNoIdentity for
// standard input.
func (in *Input) Digest() ([]byte, error) {
	var sums [][]byte
	for _, name := range in.names {
		if name == Stdin {
			return nil, ErrNoIdentity
		}
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		sums = append(sums, h.Sum(nil))
	}
	if len(sums) == 1 {
		return sums[0], nil
	}
	h := sha256.New()
	for _, s := range sums {
		h.Write(s)
	}
	return h.Sum(nil), nil
}

// compressedExpansion is how much larger a compressed input is taken to
// be once decompressed, for EstimatedBytes: gzip and zstd shrink CSV and
// NDJSON to a third or a quarter (the USGS file: 1.84 MB, 0.56 MB gzipped).
const compressedExpansion = 4

// EstimatedBytes returns about how many bytes the inputs hold
// uncompressed (a compressed file counts 4 times its size), and whether it
// can be told (not for standard input).
func (in *Input) EstimatedBytes() (int64, bool) {
	var n int64
	for _, name := range in.names {
		if name == Stdin {
			return 0, false
		}
		st, err := os.Stat(name)
		if err != nil {
			return 0, false
		}
		l := strings.ToLower(name)
		compressed := strings.HasSuffix(l, ".gz") || strings.HasSuffix(l, ".zst") || strings.HasSuffix(l, ".zstd") ||
			in.cfg.Compression == CompressionGzip || in.cfg.Compression == CompressionZstd
		if compressed {
			n += compressedExpansion * st.Size()
		} else {
			n += st.Size()
		}
	}
	return n, true
}

// Close closes the input being read.
func (in *Input) Close() error {
	var err error
	if in.cur != nil {
		err = in.cur.close()
		in.cur = nil
	}
	if in.stdin != nil {
		err = errors.Join(err, in.stdin.close())
		in.stdin = nil
	}
	in.i = len(in.names)
	return err
}

// ErrTooLargeForEmbedded is returned by CheckEmbedded for an input over
// its limit.
var ErrTooLargeForEmbedded = errors.New("bulkload: input too large for the in-process broker")

// CheckEmbedded checks the inputs against limitMiB, the most MiB
// (uncompressed, as EstimatedBytes estimates) an in-process Kafka broker
// should hold: it keeps every record in memory, about 10 times the CSV
// size. It returns the estimate in MiB; an error wrapping
// ErrTooLargeForEmbedded over the limit; and warn, for an input over a
// quarter of the limit or of unknown size (standard input). limitMiB ≤ 0:
// no limit.
func (in *Input) CheckEmbedded(limitMiB int64) (estimateMiB float64, warn bool, err error) {
	if limitMiB <= 0 {
		return 0, false, nil
	}
	est, known := in.EstimatedBytes()
	if !known {
		return 0, true, nil
	}
	limit, mib := limitMiB<<20, float64(est)/(1<<20)
	if est > limit {
		return mib, false, fmt.Errorf("%w: about %.1f MiB (uncompressed estimate), over %d MiB", ErrTooLargeForEmbedded, mib, limitMiB)
	}
	return mib, est > limit/4, nil
}
