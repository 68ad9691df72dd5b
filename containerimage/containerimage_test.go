package containerimage_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/containerimage"
)

// staticBinary builds a small static Go program, as the release build
// builds sluice.
func staticBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/hello\n"), 0o644))
	bin := filepath.Join(dir, "hello")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func TestBuild(t *testing.T) {
	t.Parallel()
	bin := staticBinary(t)
	cfg := containerimage.Config{Binary: bin, Version: "1.2.3", Revision: "abc"}
	img, err := containerimage.Build(cfg)
	require.NoError(t, err)

	cf, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "linux", cf.OS)
	require.Equal(t, runtime.GOARCH, cf.Architecture)
	require.Equal(t, "65532:65532", cf.Config.User)
	require.Equal(t, []string{"/usr/local/bin/sluice"}, cf.Config.Entrypoint)
	require.Equal(t, "/tmp", cf.Config.WorkingDir)
	require.Equal(t, "1.2.3", cf.Config.Labels["org.opencontainers.image.version"])
	require.Equal(t, "abc", cf.Config.Labels["org.opencontainers.image.revision"])

	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	modes := map[string]int64{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Zero(t, h.Uid, h.Name)
		require.Zero(t, h.ModTime.Unix(), "%s: reproducible times", h.Name)
		modes[h.Name] = h.Mode
	}
	require.Equal(t, map[string]int64{
		"etc/": 0o755, "etc/group": 0o644, "etc/passwd": 0o644,
		"etc/ssl/": 0o755, "etc/ssl/certs/": 0o755, "etc/ssl/certs/ca-certificates.crt": 0o644,
		"tmp/": 0o1777,
		"usr/": 0o755, "usr/local/": 0o755, "usr/local/bin/": 0o755, "usr/local/bin/sluice": 0o755,
	}, modes)

	// The same inputs give the same image.
	again, err := containerimage.Build(cfg)
	require.NoError(t, err)
	d1, err := img.Digest()
	require.NoError(t, err)
	d2, err := again.Digest()
	require.NoError(t, err)
	require.Equal(t, d1, d2)

	// Written as an OCI image layout, named.
	dir := filepath.Join(t.TempDir(), "oci")
	require.NoError(t, containerimage.WriteLayout(dir, img, "localhost/sluice:1.2.3"))
	p, err := layout.FromPath(dir)
	require.NoError(t, err)
	idx, err := p.ImageIndex()
	require.NoError(t, err)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, m.Manifests, 1)
	require.Equal(t, d1, m.Manifests[0].Digest)
	require.Equal(t, "localhost/sluice:1.2.3", m.Manifests[0].Annotations["org.opencontainers.image.ref.name"])
	require.ErrorContains(t, containerimage.WriteLayout(dir, img, "x"), "not empty")
}

func TestBuildRefuses(t *testing.T) {
	t.Parallel()
	bin := staticBinary(t)
	dir := t.TempDir()
	text := filepath.Join(dir, "text")
	require.NoError(t, os.WriteFile(text, []byte("not a certificate\n"), 0o644))
	dynamic, err := exec.LookPath("ls") // Debian's coreutils are dynamically linked
	require.NoError(t, err)
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	for name, tc := range map[string]struct {
		cfg  containerimage.Config
		want string
	}{
		"no binary":      {containerimage.Config{}, "no binary"},
		"not an ELF":     {containerimage.Config{Binary: text}, "not an ELF executable"},
		"dynamic":        {containerimage.Config{Binary: dynamic}, "dynamically linked"},
		"another arch":   {containerimage.Config{Binary: bin, Arch: other}, "not " + other},
		"no certificate": {containerimage.Config{Binary: bin, CABundle: text}, "no PEM certificate"},
		"no CA bundle":   {containerimage.Config{Binary: bin, CABundle: filepath.Join(dir, "missing")}, "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := containerimage.Build(tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
