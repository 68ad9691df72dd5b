//go:build e2e

package e2e

// The release image, built and run without Docker: scripts/image.sh builds
// the static binary and the image from scratch layers (cmd/sluice-image)
// and loads it into podman (installed with apt-get when missing); this test
// checks the image against the Dockerfile, read with BuildKit's own parser,
// and runs in it, with the root filesystem read-only: `sluice --version`,
// the embedded demo, a load whose dead letter goes to the working directory
// (/tmp), and a write outside /tmp, which must fail.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/stretchr/testify/require"
)

// imageLayout is what the Dockerfile and the daemonless build must agree on.
type imageLayout struct {
	User       string // numeric uid:gid
	Entrypoint []string
	WorkingDir string
	Env        map[string]string
	Labels     map[string]string
	Binary     string // the sluice binary's path
	CABundle   string // the CA bundle's path
	// Users maps the names of passwd's users to their numeric uid:gid.
	Users map[string]string
}

// distrolessStaticNonroot is what the Dockerfile's runtime base brings, as
// distroless documents it (GoogleContainerTools/distroless, base/README.md
// and the static image's config): its user nonroot is 65532:65532, its
// working directory the user's home, its CA bundle Debian's. It has more
// that the image built without Docker leaves out and sluice does not read:
// tzdata, /etc/nsswitch.conf, /etc/os-release, package metadata, and the
// user's home /home/nonroot (writable by the user, but not with the root
// filesystem read-only).
var distrolessStaticNonroot = imageLayout{
	User:       "65532:65532",
	WorkingDir: "/home/nonroot",
	Env: map[string]string{
		"PATH":          "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
	},
	Labels:   map[string]string{},
	CABundle: "/etc/ssl/certs/ca-certificates.crt",
	Users:    map[string]string{"root": "0:0", "nobody": "65534:65534", "nonroot": "65532:65532"},
}

var distrolessStaticNonrootRef = regexp.MustCompile(`^gcr\.io/distroless/static-debian\d+:nonroot@sha256:[0-9a-f]{64}$`)

func TestReleaseImage(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	const version, revision = "0.0.0-e2e", "e2e-revision"
	want := dockerfileLayout(t, filepath.Join(root, "Dockerfile"), map[string]string{"VERSION": version, "REVISION": revision})
	b := imageBuild{root: root, cache: t.TempDir(), version: version, revision: revision}

	image := b.load(t)
	img, cf, files := b.read(t, image)
	got := builtLayout(t, cf, files, root)
	require.Equal(t, want, got, "the image built without Docker has the Dockerfile's layout")
	uid := strings.Split(got.User, ":")[0]
	checkImageOwnership(t, files, uid)
	checkPodmanImage(t, image, img)

	b.checkVersion(t)
	b.checkDemo(t, uid)
	b.checkDeadLetter(t)
	b.checkReadOnlyRoot(t)
}

// imageBuild is a run of scripts/image.sh: the repository it builds, the
// cache it builds in, and the version and revision it stamps.
type imageBuild struct {
	root, cache       string
	version, revision string
}

// script returns the command `scripts/image.sh args...`.
func (b imageBuild) script(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(b.root, "scripts", "image.sh"), args...)
	cmd.Env = append(os.Environ(), "SLUICE_CACHE="+b.cache, "VERSION="+b.version, "REVISION="+b.revision)
	return cmd
}

// load builds the image and loads it into podman, removing it when the
// test ends, and returns its name.
func (b imageBuild) load(t *testing.T) string {
	t.Helper()
	start := time.Now()
	out, err := b.script("load").Output()
	require.NoError(t, err, "scripts/image.sh load: %s", stderrOf(err))
	image := lastLine(out)
	require.Equal(t, "localhost/sluice:"+b.version, image)
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "--force", image).Run() })
	t.Logf("image built and loaded in %s", time.Since(start).Round(time.Millisecond))
	return image
}

// read returns the image as written in the OCI layout: the image, its
// config and the entries of its one layer.
func (b imageBuild) read(t *testing.T, image string) (v1.Image, *v1.ConfigFile, map[string]layerFile) {
	t.Helper()
	p, err := layout.FromPath(filepath.Join(b.cache, "image", "oci"))
	require.NoError(t, err)
	index, err := p.ImageIndex()
	require.NoError(t, err)
	manifest, err := index.IndexManifest()
	require.NoError(t, err)
	require.Len(t, manifest.Manifests, 1)
	require.Equal(t, image, manifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"])
	img, err := p.Image(manifest.Manifests[0].Digest)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "linux", cf.OS)
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1, "one layer from scratch, no base")
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	files := readLayer(t, rc)
	require.NoError(t, rc.Close())
	return img, cf, files
}

// builtLayout returns the layout of the image built without Docker, from
// its config and its layer's files. It checks the binary (the one ELF
// file: static, stripped, built with -trimpath) and the CA bundle (at the
// path the environment names, certificates in it).
func builtLayout(t *testing.T, cf *v1.ConfigFile, files map[string]layerFile, root string) imageLayout {
	t.Helper()
	got := imageLayout{
		User:       cf.Config.User,
		Entrypoint: cf.Config.Entrypoint,
		WorkingDir: cf.Config.WorkingDir,
		Env:        envMap(t, cf.Config.Env),
		Labels:     cf.Config.Labels,
		Users:      passwdUsers(t, files),
	}
	for name, f := range files {
		if f.hdr.Typeflag == tar.TypeReg && bytes.HasPrefix(f.data, []byte("\x7fELF")) {
			require.Empty(t, got.Binary, "one executable in the image: %s and %s", got.Binary, name)
			got.Binary = name
			checkStaticBinary(t, f, root)
		}
	}
	got.CABundle = got.Env["SSL_CERT_FILE"]
	ca, ok := files[got.CABundle]
	require.True(t, ok, "the CA bundle %s is in the image", got.CABundle)
	require.Greater(t, countCerts(t, ca.data), 100, "the CA bundle holds the public CAs")
	return got
}

// checkImageOwnership checks that everything is root's and read-only to
// the user uid except /tmp, world-writable with the sticky bit like any
// /tmp.
func checkImageOwnership(t *testing.T, files map[string]layerFile, uid string) {
	t.Helper()
	var writable []string
	for name, f := range files {
		require.Zero(t, f.hdr.Uid, "%s is root's", name)
		require.Zero(t, f.hdr.Gid, "%s is root's group's", name)
		if f.hdr.Mode&0o002 != 0 || strconv.Itoa(f.hdr.Uid) == uid {
			writable = append(writable, name)
		}
	}
	require.Equal(t, []string{"/tmp"}, writable, "the one writable path")
	require.Equal(t, int64(0o1777), files["/tmp"].hdr.Mode)
	require.Equal(t, byte(tar.TypeDir), files["/tmp"].hdr.Typeflag)
}

// checkPodmanImage checks that podman runs that very image: the one whose
// config is img's.
func checkPodmanImage(t *testing.T, image string, img v1.Image) {
	t.Helper()
	id, err := exec.Command("podman", "image", "inspect", "--format", "{{.Id}}", image).Output()
	require.NoError(t, err, "%s", stderrOf(err))
	configDigest, err := img.ConfigName()
	require.NoError(t, err)
	require.Equal(t, configDigest.Hex, strings.TrimSpace(string(id)))
}

// checkVersion runs sluice --version in the image, with the root
// filesystem read-only.
func (b imageBuild) checkVersion(t *testing.T) {
	t.Helper()
	start := time.Now()
	out, err := b.script("run", "--", "--version").Output()
	require.NoError(t, err, "%s", stderrOf(err))
	require.Equal(t, "sluice version "+b.version+" ("+b.revision+")", strings.TrimSpace(string(out)))
	t.Logf("sluice --version ran in %s", time.Since(start).Round(time.Millisecond))
}

// checkDemo runs the demo in the image: `make demo`'s bulk load, the input
// mounted read-only, /tmp a host folder (the summary is read from it), no
// network. sluice must run as the user uid.
func (b imageBuild) checkDemo(t *testing.T, uid string) {
	t.Helper()
	start := time.Now()
	cmd := b.script("demo")
	var demoOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &demoOut, &demoOut
	require.NoError(t, cmd.Run(), "scripts/image.sh demo:\n%s", demoOut.String())
	t.Logf("the demo ran in the image in %s:\n%s", time.Since(start).Round(time.Millisecond), summaryLines(demoOut.String()))
	tmp := filepath.Join(b.cache, "image", "demo")
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"demo-summary.json"}, names, "the demo writes its summary to /tmp, and nothing else (no dead letters)")
	info, err := os.Stat(filepath.Join(tmp, "demo-summary.json"))
	require.NoError(t, err)
	require.Equal(t, uid, strconv.Itoa(int(info.Sys().(*syscall.Stat_t).Uid)), "sluice ran as the image's user")
	raw, err := os.ReadFile(filepath.Join(tmp, "demo-summary.json"))
	require.NoError(t, err)
	var summary struct {
		Delivered    int64 `json:"records_delivered"`
		DeadLettered int64 `json:"records_dead_lettered"`
		Duplicates   int64 `json:"duplicates_at_sink"`
		Throttled    int64 `json:"sink_throttled"`
		MaxUnits1s   int64 `json:"max_units_1s_window"`
	}
	require.NoError(t, json.Unmarshal(raw, &summary))
	require.EqualValues(t, 9366, summary.Delivered, "every earthquake delivered")
	require.Zero(t, summary.DeadLettered)
	require.Zero(t, summary.Duplicates)
	require.Zero(t, summary.Throttled, "the sink never throttled")
	require.LessOrEqual(t, summary.MaxUnits1s, int64(2020), "the sink's busiest second within 1%% of the capacity, 2,000")
}

// checkDeadLetter runs a load in the image whose dead letter goes to the
// default dead-letter file, under .sluice/ in the working directory: /tmp,
// writable.
func (b imageBuild) checkDeadLetter(t *testing.T) {
	t.Helper()
	dlTmp := t.TempDir()
	require.NoError(t, os.Chmod(dlTmp, 0o1777))
	cmd := b.script("run", "-i", "--network", "none", "--", "bulk-load", "--embedded", "--capacity", "100",
		"--topic", "deadletters", "--id-field", "id", "--format", "csv", "-")
	cmd.Env = append(cmd.Env, "SLUICE_IMAGE_TMP="+dlTmp)
	cmd.Stdin = strings.NewReader("id,mag\nus1,4.5\n,3.0\n")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "a row without an ID is dead-lettered: %v\n%s", err, out)
	require.Equal(t, 3, exit.ExitCode(), "exit 3: records were dead-lettered\n%s", out)
	dl, err := os.ReadFile(filepath.Join(dlTmp, ".sluice", "deadletters.dlq.ndjson"))
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(dl), `"value":",3.0"`)
}

// checkReadOnlyRoot checks that a write outside /tmp fails in the image:
// the root filesystem is read-only.
func (b imageBuild) checkReadOnlyRoot(t *testing.T) {
	t.Helper()
	cmd := b.script("run", "-i", "--network", "none", "--", "bulk-load", "--embedded", "--capacity", "100",
		"--topic", "readonly", "--id-field", "id", "--format", "csv", "--summary-json", "/summary.json", "-")
	cmd.Stdin = strings.NewReader("id,mag\nus1,4.5\n")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "a summary written to / fails: %v\n%s", err, out)
	require.Equal(t, 1, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), "open /summary.json: read-only file system")
}

// dockerfileLayout reads the Dockerfile with BuildKit's parser and returns
// the layout of its runtime stage (the last) built with args: its base's
// (distroless static nonroot, the only base it may have) with its
// instructions applied. It checks that the binary copied in is the one the
// build stage builds, static and with -trimpath.
func dockerfileLayout(t *testing.T, dockerfile string, args map[string]string) imageLayout {
	t.Helper()
	f, err := os.Open(dockerfile)
	require.NoError(t, err)
	defer f.Close()
	ast, err := parser.Parse(f)
	require.NoError(t, err)
	stages, metaArgs, err := instructions.Parse(ast.AST, nil)
	require.NoError(t, err)
	require.Empty(t, metaArgs, "no ARG before the first FROM")
	require.Len(t, stages, 2, "a build stage and a runtime stage")
	build, runtime := stages[0], stages[1]
	require.Equal(t, "build", build.Name)

	// The build stage: where it writes the binary, and how.
	var output string
	for _, c := range build.Commands {
		run, ok := c.(*instructions.RunCommand)
		if !ok || !slices.ContainsFunc(run.CmdLine, func(s string) bool { return strings.Contains(s, "go build") }) {
			continue
		}
		words, err := shell.NewLex(ast.EscapeToken).ProcessWords(strings.Join(run.CmdLine, " "), shell.EnvsFromSlice(nil))
		require.NoError(t, err)
		require.Contains(t, words, "CGO_ENABLED=0", "a static binary")
		require.Contains(t, words, "-trimpath")
		i := slices.Index(words, "-o")
		require.Positive(t, i, "go build -o")
		output = words[i+1]
	}
	require.NotEmpty(t, output, "the build stage runs go build -o FILE")

	// The runtime stage.
	require.Regexp(t, distrolessStaticNonrootRef, runtime.BaseName, "the runtime base is distroless static nonroot, by digest")
	l := distrolessStaticNonroot
	l.Env, l.Labels = maps.Clone(l.Env), maps.Clone(l.Labels)
	env := map[string]string{}
	lex := shell.NewLex(ast.EscapeToken)
	expand := func(word string) (string, error) {
		var kv []string
		for k, v := range env {
			kv = append(kv, k+"="+v)
		}
		s, _, err := lex.ProcessWord(word, shell.EnvsFromSlice(kv))
		return s, err
	}
	for _, c := range runtime.Commands {
		if e, ok := c.(instructions.SupportsSingleWordExpansion); ok {
			require.NoError(t, e.Expand(expand), "%s", c)
		}
		switch c := c.(type) {
		case *instructions.ArgCommand:
			for _, a := range c.Args {
				v, given := args[a.Key]
				if !given {
					v = a.ValueString()
				}
				env[a.Key] = v
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env[kv.Key], l.Env[kv.Key] = kv.Value, kv.Value
			}
		case *instructions.LabelCommand:
			for _, kv := range c.Labels {
				l.Labels[kv.Key] = kv.Value
			}
		case *instructions.CopyCommand:
			require.Equal(t, build.Name, c.From, "%s: the runtime stage copies only from the build stage", c)
			require.Equal(t, []string{output}, c.SourcePaths, "%s: the binary the build stage builds", c)
			dest := c.DestPath
			if strings.HasSuffix(dest, "/") {
				dest += path.Base(output)
			}
			require.True(t, path.IsAbs(dest), "%s", c)
			l.Binary = dest
		case *instructions.WorkdirCommand:
			require.True(t, path.IsAbs(c.Path), "%s", c)
			l.WorkingDir = c.Path
		case *instructions.UserCommand:
			l.User = numericUser(t, c.User, l.Users)
		case *instructions.EntrypointCommand:
			require.False(t, c.PrependShell, "%s: exec form (the base has no shell)", c)
			l.Entrypoint = c.CmdLine
		default:
			require.Failf(t, "unexpected instruction", "%s: the runtime stage has no shell to run it", c)
		}
	}
	return l
}

// numericUser resolves USER's user[:group] to uid:gid with the base's
// passwd.
func numericUser(t *testing.T, user string, users map[string]string) string {
	t.Helper()
	name, group, _ := strings.Cut(user, ":")
	ids, ok := users[name]
	if !ok {
		_, err := strconv.Atoi(name)
		require.NoError(t, err, "USER %s: no such user in the base", user)
		ids = name + ":" + name
	}
	uid, gid, _ := strings.Cut(ids, ":")
	if group != "" {
		if g, ok := users[group]; ok {
			_, gid, _ = strings.Cut(g, ":")
		} else {
			gid = group
		}
	}
	return uid + ":" + gid
}

// layerFile is an entry of the image's layer.
type layerFile struct {
	hdr  *tar.Header
	data []byte
}

// readLayer returns the entries of a layer by absolute path, without a
// trailing slash.
func readLayer(t *testing.T, r io.Reader) map[string]layerFile {
	t.Helper()
	files := map[string]layerFile{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		require.NoError(t, err)
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		name := path.Clean("/" + hdr.Name)
		_, dup := files[name]
		require.False(t, dup, "%s twice in the layer", name)
		files[name] = layerFile{hdr: hdr, data: data}
	}
}

// checkStaticBinary checks the image's binary: an executable for everyone,
// no program interpreter (no dynamic loader in the image), no symbol table
// (-s), no path of this checkout in it (-trimpath).
func checkStaticBinary(t *testing.T, f layerFile, root string) {
	t.Helper()
	require.Equal(t, int64(0o755), f.hdr.Mode, "%s", f.hdr.Name)
	e, err := elf.NewFile(bytes.NewReader(f.data))
	require.NoError(t, err)
	for _, p := range e.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "a static binary")
	}
	require.Nil(t, e.Section(".symtab"), "stripped (-s)")
	require.False(t, bytes.Contains(f.data, []byte(root)), "built with -trimpath")
}

// passwdUsers returns the users of the layer's /etc/passwd as uid:gid by
// name, checking that /etc/group has each one's group.
func passwdUsers(t *testing.T, files map[string]layerFile) map[string]string {
	t.Helper()
	groups := map[string]bool{}
	for _, line := range lines(t, files, "/etc/group") {
		fields := strings.Split(line, ":")
		require.Len(t, fields, 4, "/etc/group: %s", line)
		groups[fields[2]] = true
	}
	users := map[string]string{}
	for _, line := range lines(t, files, "/etc/passwd") {
		fields := strings.Split(line, ":")
		require.Len(t, fields, 7, "/etc/passwd: %s", line)
		require.True(t, groups[fields[3]], "/etc/group has the group of %s", line)
		users[fields[0]] = fields[2] + ":" + fields[3]
	}
	return users
}

func lines(t *testing.T, files map[string]layerFile, name string) []string {
	t.Helper()
	f, ok := files[name]
	require.True(t, ok, "%s is in the image", name)
	require.Equal(t, int64(0o644), f.hdr.Mode, "%s", name)
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(f.data))
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func countCerts(t *testing.T, pemData []byte) int {
	t.Helper()
	n := 0
	for {
		var b *pem.Block
		b, pemData = pem.Decode(pemData)
		if b == nil {
			return n
		}
		if b.Type == "CERTIFICATE" {
			_, err := x509.ParseCertificate(b.Bytes)
			require.NoError(t, err)
			n++
		}
	}
}

func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, "env %q", kv)
		m[k] = v
	}
	return m
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	return s[strings.LastIndex(s, "\n")+1:]
}

func stderrOf(err error) string {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(exit.Stderr)
	}
	return ""
}

// summaryLines returns the human summary of a bulk load's output (its lines
// that are not log records).
func summaryLines(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if line != "" && !strings.HasPrefix(line, "time=") && !strings.HasPrefix(line, "image.sh:") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
