package e2e

// Checks the Docker build context without a Docker engine: .dockerignore is
// read and matched with moby/patternmatcher (the matcher Docker and
// BuildKit use), the files it keeps are copied out, and the binary is built
// from that copy as the Dockerfile builds it. No build tag: it runs with
// `go test ./...`.

import (
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"github.com/stretchr/testify/require"
)

// The most the build context may weigh; the Go sources are well under it.
const maxContextBytes = 4 << 20

func TestDockerBuildContext(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	require.NoError(t, err)
	patterns, err := ignorefile.ReadAll(f)
	require.NoError(t, f.Close())
	require.NoError(t, err)
	pm, err := patternmatcher.New(patterns)
	require.NoError(t, err)
	require.False(t, pm.Exclusions(), "no ! patterns: an excluded directory is skipped whole")
	excluded := func(rel string) bool {
		m, err := pm.MatchesOrParentMatches(rel)
		require.NoError(t, err)
		return m
	}

	for _, rel := range []string{".git", ".git/HEAD", ".cache/kafka", "bin/sluice", "sluice", "bench/s1.png", "bench/results.json",
		"testdata/usgs-earthquakes-2025-05.csv", "ingest/testdata/x.csv", "e2e/helm_test.go", "ingest/worker_test.go",
		"deploy/helm/sluice/Chart.yaml", "README.md"} {
		require.True(t, excluded(rel), "%s stays out of the build context", rel)
	}
	for _, rel := range []string{"go.mod", "go.sum", "cmd/sluice/main.go", "ingest/worker.go", "sink/open.go"} {
		require.False(t, excluded(rel), "%s is in the build context", rel)
	}

	// The context as Docker would send it, copied out.
	ctxDir := t.TempDir()
	var size int64
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if excluded(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		dst := filepath.Join(ctxDir, filepath.FromSlash(rel))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		size += info.Size()
		return copyFile(p, dst)
	})
	require.NoError(t, err)
	require.Less(t, size, int64(maxContextBytes), "the build context weighs %d bytes", size)

	// The Dockerfile's build: its FROM lines pinned, its version arguments
	// passed to the linker.
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	from := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(string(dockerfile), -1)
	require.Len(t, from, 2, "a build stage and a runtime stage")
	require.Regexp(t, `^golang:\d+\.\d+\.\d+-\w+$`, from[0][1], "the Go toolchain at an exact release")
	require.Regexp(t, `^gcr\.io/distroless/static-debian\d+:nonroot@sha256:[0-9a-f]{64}$`, from[1][1], "the runtime image by digest")
	for _, arg := range []string{"VERSION", "REVISION"} {
		require.Regexp(t, `(?m)^ARG `+arg+`=`, string(dockerfile))
		require.Contains(t, string(dockerfile), "-X main."+strings.ToLower(arg)+"=$"+arg)
	}

	bin := filepath.Join(t.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=0.0.0-test -X main.revision=test",
		"-o", bin, "./cmd/sluice")
	cmd.Dir = ctxDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/sluice in the build context: %s", out)
	out, err = exec.Command(bin, "--help").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "worker")
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
