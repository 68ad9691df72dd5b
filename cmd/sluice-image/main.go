// Command sluice-image writes sluice's release image as an OCI image layout,
// without Docker or any container engine (see package containerimage).
// scripts/image.sh builds the static binary, runs it and loads the result
// into podman:
//
//	go run ./cmd/sluice-image --binary bin/sluice-static --version 0.1.0 \
//	    --revision "$(git rev-parse HEAD)" --out .cache/image/oci
//
// It prints the image's digest. It exits 1 when the image cannot be built
// (a binary that is not static, no CA bundle, an --out that is not empty),
// 2 on bad flags.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/containerimage"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app := &cli.App{
		Name:  "sluice-image",
		Usage: "write sluice's release image as an OCI image layout, without a container engine",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "binary", Usage: "the static sluice `file` (CGO_ENABLED=0) to put at " + containerimage.BinaryPath},
			&cli.StringFlag{Name: "ca-bundle", Value: containerimage.CABundlePath, Usage: "the PEM CA bundle `file` to put at " + containerimage.CABundlePath},
			&cli.StringFlag{Name: "version", Value: "dev", Usage: "the label org.opencontainers.image.version"},
			&cli.StringFlag{Name: "revision", Value: "unknown", Usage: "the label org.opencontainers.image.revision"},
			&cli.StringFlag{Name: "arch", Usage: "the image's `GOARCH` (default: this machine's)"},
			&cli.StringFlag{Name: "ref", Value: "localhost/sluice:dev", Usage: "the image's `name` in the layout (org.opencontainers.image.ref.name)"},
			&cli.StringFlag{Name: "out", Usage: "the `directory` of the OCI image layout (created; must be empty)"},
		},
		Action: func(c *cli.Context) error {
			for _, name := range []string{"binary", "out"} {
				if c.String(name) == "" {
					return usageError{fmt.Errorf("--%s is required", name)}
				}
			}
			img, err := containerimage.Build(containerimage.Config{
				Binary:   c.String("binary"),
				CABundle: c.String("ca-bundle"),
				Version:  c.String("version"),
				Revision: c.String("revision"),
				Arch:     c.String("arch"),
			})
			if err != nil {
				return err
			}
			if err := containerimage.WriteLayout(c.String("out"), img, c.String("ref")); err != nil {
				return err
			}
			digest, err := img.Digest()
			if err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, digest)
			return nil
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err} },
	}
	if err := app.RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-image:", err)
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	}
	return 0
}

// usageError marks bad flags (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }
