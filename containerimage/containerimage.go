// Package containerimage builds sluice's release image without a container
// engine: one layer made from scratch (no base image to pull) holding the
// static sluice binary, a CA bundle, the passwd and group entries of the
// non-root user and an empty world-writable /tmp, and an OCI image config
// that runs the binary as that user. The image is written as an OCI image
// layout, which podman, skopeo and crane load as they are.
//
// The layout is the Dockerfile's (its runtime stage, on distroless static
// nonroot): the same binary path, entrypoint, user, working directory, CA
// bundle path, environment and labels; e2e/image_test.go checks the two
// against each other. Everything in the layer is owned by root and read-only
// to the user, except /tmp: with the root filesystem read-only, /tmp (a
// tmpfs, an emptyDir or a volume) is the one path sluice may write.
//
// The image is reproducible: file times and the config's creation time are
// fixed (the Unix epoch unless Config.Created says otherwise), so the same
// binary and CA bundle give the same digest.
package containerimage

import (
	"archive/tar"
	"bytes"
	"cmp"
	"crypto/x509"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's layout.
const (
	// BinaryPath is where the sluice binary is, and the entrypoint.
	BinaryPath = "/usr/local/bin/sluice"
	// CABundlePath is the CA bundle's path: where Go's crypto/x509 looks
	// first on Linux, and where Debian's ca-certificates (and so distroless)
	// put it.
	CABundlePath = "/etc/ssl/certs/ca-certificates.crt"
	// UID and GID are the non-root user's and group's, named nonroot as in
	// distroless.
	UID, GID = 65532, 65532
	// User is the config's user: numeric, so that Kubernetes can check
	// runAsNonRoot without a passwd lookup.
	User = "65532:65532"
	// WorkingDir is the working directory: the one writable path, so that
	// files sluice writes beside itself by default (bulk-load --embedded's
	// dead-letter file) can be written.
	WorkingDir = "/tmp"
)

// Env is the config's environment, as in distroless.
var Env = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"SSL_CERT_FILE=" + CABundlePath,
}

// The passwd and group files: root, nobody and the non-root user, whose
// home is distroless's (it does not exist here; nothing reads it).
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:65532:\n"
)

// Config says what goes into the image.
type Config struct {
	// Binary is the path of the sluice binary: a static Linux ELF
	// executable (CGO_ENABLED=0) for Arch. Required.
	Binary string
	// CABundle is the path of the PEM CA bundle to copy in. The default is
	// the build host's CABundlePath (Debian's ca-certificates).
	CABundle string
	// Version and Revision go into the labels
	// org.opencontainers.image.version and .revision. The defaults are
	// "dev" and "unknown", the Dockerfile's.
	Version, Revision string
	// Arch is the image's GOARCH. The default is the build host's.
	Arch string
	// Created is the time of the files and of the config. The default is
	// the Unix epoch.
	Created time.Time
}

// Labels returns the image's labels for a version and a revision.
func Labels(version, revision string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    "sluice",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": revision,
	}
}

// Build returns the image. It fails when the binary is not a static ELF
// executable for cfg.Arch or the CA bundle holds no certificate.
func Build(cfg Config) (v1.Image, error) {
	if cfg.Binary == "" {
		return nil, errors.New("containerimage: no binary")
	}
	cfg.CABundle = cmp.Or(cfg.CABundle, CABundlePath)
	cfg.Version = cmp.Or(cfg.Version, "dev")
	cfg.Revision = cmp.Or(cfg.Revision, "unknown")
	cfg.Arch = cmp.Or(cfg.Arch, runtime.GOARCH)
	if cfg.Created.IsZero() {
		cfg.Created = time.Unix(0, 0)
	}
	cfg.Created = cfg.Created.UTC()

	bin, err := os.ReadFile(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("containerimage: %w", err)
	}
	if err := checkStatic(bin, cfg.Arch); err != nil {
		return nil, fmt.Errorf("containerimage: %s: %w", cfg.Binary, err)
	}
	ca, err := os.ReadFile(cfg.CABundle)
	if err != nil {
		return nil, fmt.Errorf("containerimage: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("containerimage: %s: no PEM certificate", cfg.CABundle)
	}

	files := []file{
		{path: "/etc/", mode: 0o755},
		{path: "/etc/group", mode: 0o644, data: []byte(group)},
		{path: "/etc/passwd", mode: 0o644, data: []byte(passwd)},
		{path: "/etc/ssl/", mode: 0o755},
		{path: "/etc/ssl/certs/", mode: 0o755},
		{path: CABundlePath, mode: 0o644, data: ca},
		{path: "/tmp/", mode: 0o777 | sticky},
		{path: "/usr/", mode: 0o755},
		{path: "/usr/local/", mode: 0o755},
		{path: "/usr/local/bin/", mode: 0o755},
		{path: BinaryPath, mode: 0o755, data: bin},
	}
	layerTar, err := tarFiles(files, cfg.Created)
	if err != nil {
		return nil, fmt.Errorf("containerimage: %w", err)
	}
	layer, err := layerFromTar(layerTar)
	if err != nil {
		return nil, fmt.Errorf("containerimage: %w", err)
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return nil, fmt.Errorf("containerimage: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("containerimage: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", cfg.Arch
	cf.Created = v1.Time{Time: cfg.Created}
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: []string{BinaryPath},
		WorkingDir: WorkingDir,
		Env:        Env,
		Labels:     Labels(cfg.Version, cfg.Revision),
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("containerimage: %w", err)
	}
	return img, nil
}

// WriteLayout writes img as the only image of a new OCI image layout in dir
// (which must not exist or be empty), named ref (the annotation
// org.opencontainers.image.ref.name, e.g. "localhost/sluice:0.1.0").
func WriteLayout(dir string, img v1.Image, ref string) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("containerimage: %s is not empty", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("containerimage: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref,
	})); err != nil {
		return fmt.Errorf("containerimage: %w", err)
	}
	return nil
}

// sticky is the sticky bit as the tar header's mode holds it.
const sticky = 0o1000

// file is an entry of the layer: a directory when path ends in a slash.
type file struct {
	path string
	mode int64
	data []byte
}

// tarFiles returns the layer's tar: every entry owned by root, at time t.
func tarFiles(files []file, t time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name:    strings.TrimPrefix(f.path, "/"),
			Mode:    f.mode,
			ModTime: t,
			Format:  tar.FormatPAX,
		}
		if strings.HasSuffix(f.path, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("%s: %w", path.Clean(f.path), err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("%s: %w", path.Clean(f.path), err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// layerFromTar returns an OCI layer (gzip) of an uncompressed tar.
func layerFromTar(b []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// goarchMachine maps a GOARCH to its ELF machine.
var goarchMachine = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"386":     elf.EM_386,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// checkStatic fails unless b is a Linux ELF executable for goarch without
// a program interpreter (a dynamic loader the image does not have).
func checkStatic(b []byte, goarch string) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if want, ok := goarchMachine[goarch]; !ok {
		return fmt.Errorf("unknown architecture %q", goarch)
	} else if f.Machine != want {
		return fmt.Errorf("built for %s, not %s", f.Machine, goarch)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("not an executable (%s)", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (build it with CGO_ENABLED=0)")
		}
	}
	return nil
}
