package e2e

// Checks docker-compose.yml against the CLI it runs, without a Docker
// engine: the file is loaded with compose-go (the loader docker compose
// itself uses, with the same interpolation and path resolution), and every
// sluice command and SLUICE_* variable in it is checked against the
// `--help` of a freshly built sluice binary. Unlike the rest of the package
// this file has no build tag: it runs with `go test ./...`.

import (
	"context"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

const composeProjectName = "sluice"

// The connection variables whose host names another compose service.
var composeConnVars = []string{"SLUICE_BROKERS", "SLUICE_REDIS_ADDR", "SLUICE_SINK"}

func TestDockerCompose(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	composeFile := filepath.Join(root, "docker-compose.yml")

	// `docker compose up`: no profile active.
	p := loadCompose(t, root, composeFile)
	require.Equal(t, composeProjectName, p.Name)
	require.ElementsMatch(t, []string{"kafka", "redis", "sink", "worker"}, p.ServiceNames(),
		"services started by `docker compose up`")
	require.Contains(t, p.DisabledServices, "loader", "loader belongs to a profile, not to `up`")

	// `docker compose --profile tools ...` / `docker compose run loader`.
	p = loadCompose(t, root, composeFile, "tools")
	require.ElementsMatch(t, []string{"kafka", "redis", "sink", "worker", "loader"}, p.ServiceNames())
	svc := func(name string) types.ServiceConfig {
		s, err := p.GetService(name)
		require.NoError(t, err)
		return s
	}
	require.Equal(t, []string{"tools"}, svc("loader").Profiles)

	// The sluice image: built from the repository (Dockerfile, whose
	// entrypoint is the sluice binary), and reused by image name.
	var sluiceImage string
	for _, s := range p.Services {
		if s.Build != nil && s.Build.Context == root {
			require.Empty(t, sluiceImage, "one service builds the sluice image")
			require.NotEmpty(t, s.Image, "service %s: the built image needs a name the others can use", s.Name)
			sluiceImage = s.Image
		}
	}
	require.NotEmpty(t, sluiceImage, "a service builds the repository's Dockerfile")
	var sluiceServices []string
	for _, s := range p.Services {
		if s.Image == sluiceImage {
			require.Empty(t, s.Entrypoint, "service %s: keep the image's sluice entrypoint", s.Name)
			sluiceServices = append(sluiceServices, s.Name)
		}
	}
	slices.Sort(sluiceServices)
	require.Equal(t, []string{"loader", "sink", "worker"}, sluiceServices)

	sluice := newSluiceCLI(t, root)
	help := func(cmdPath []string) string { return sluice.help(t, cmdPath) }
	splitCommand := func(args []string) (cmdPath, rest []string) { return sluice.splitCommand(t, args) }

	commands := map[string][]string{} // service → sluice subcommand
	args := map[string][]string{}     // service → the rest of its command
	env := map[string]map[string]string{}
	for _, name := range sluiceServices {
		s := svc(name)
		commands[name], args[name] = splitCommand(s.Command)
		env[name] = map[string]string{}
		for k, v := range s.Environment {
			require.NotNil(t, v, "service %s: %s has no value (would come from the host)", name, k)
			env[name][k] = *v
		}
	}

	// Help texts are fetched here, on the test's own goroutine (help and
	// splitCommand fail the parent test); subtests only read them.
	statusPath, statusArgs := splitCommand([]string{"pool", "status"})
	require.Empty(t, statusArgs)
	statusVars := envVars(help(statusPath))

	t.Run("commands and variables are real", func(t *testing.T) {
		require.Equal(t, []string{"worker"}, commands["worker"])
		require.Equal(t, []string{"bulk-load"}, commands["loader"])
		require.Equal(t, []string{"sink-sim"}, commands["sink"])
		for _, name := range sluiceServices {
			h := help(commands[name])
			vars := envVars(h)
			for k := range env[name] {
				if strings.HasPrefix(k, "SLUICE_") {
					require.True(t, slices.Contains(vars, k), "service %s: `sluice %s` has no flag for %s",
						name, strings.Join(commands[name], " "), k)
				}
			}
			for _, a := range args[name] {
				if flag, ok := strings.CutPrefix(a, "--"); ok {
					flag, _, _ = strings.Cut(flag, "=")
					require.True(t, slices.Contains(flagNames(h), flag), "service %s: `sluice %s` has no flag --%s",
						name, strings.Join(commands[name], " "), flag)
				}
			}
		}
		// The header's `docker compose run --rm worker pool status` gets the
		// worker's environment: it must name the same Redis and pool.
		for _, k := range []string{"SLUICE_REDIS_ADDR", "SLUICE_POOL"} {
			require.Contains(t, statusVars, k)
			require.Contains(t, env["worker"], k, "`docker compose run --rm worker pool status` needs %s", k)
		}
	})

	t.Run("connections name services the command waits for", func(t *testing.T) {
		for _, name := range sluiceServices {
			for _, k := range composeConnVars {
				v, ok := env[name][k]
				if !ok {
					continue
				}
				for _, hp := range splitAddrs(t, v) {
					host, _ := splitHostPort(t, hp)
					require.Contains(t, p.ServiceNames(), host, "service %s: %s=%s names no service", name, k, v)
					require.Contains(t, svc(name).DependsOn, host, "service %s: %s=%s, but no depends_on %s", name, k, v, host)
				}
			}
		}
		// Every sluice service shares one pool definition (a worker started
		// with other pool settings refuses to start).
		for _, k := range []string{"SLUICE_POOL", "SLUICE_CAPACITY", "SLUICE_PARTITIONS", "SLUICE_UNIT", "SLUICE_LEASE_TTL", "SLUICE_TOPIC"} {
			require.Equal(t, env["worker"][k], env["loader"][k], "worker and loader disagree on %s", k)
		}
	})

	t.Run("worker", func(t *testing.T) {
		w := svc("worker")
		require.GreaterOrEqual(t, w.GetScale(), 2, "several workers share the pool")
		grace := flagDefault(t, help(commands["worker"]), "grace")
		if v, ok := env["worker"]["SLUICE_GRACE"]; ok {
			d, err := time.ParseDuration(v)
			require.NoError(t, err)
			grace = d
		}
		require.NotNil(t, w.StopGracePeriod, "worker needs a stop_grace_period (docker's default is 10 s)")
		require.GreaterOrEqual(t, time.Duration(*w.StopGracePeriod), grace+3*time.Second,
			"stop_grace_period must cover --grace (%s) plus the final commit and lease release", grace)
	})

	t.Run("kafka", func(t *testing.T) {
		k := svc("kafka")
		kenv := func(name string) string {
			v := k.Environment[name]
			require.NotNil(t, v, "kafka: %s unset", name)
			return *v
		}
		roles := strings.Split(kenv("KAFKA_PROCESS_ROLES"), ",")
		require.ElementsMatch(t, []string{"broker", "controller"}, trimAll(roles), "a single KRaft node")
		require.NotContains(t, k.Environment, "KAFKA_ZOOKEEPER_CONNECT")
		require.Contains(t, kenv("KAFKA_CONTROLLER_QUORUM_VOTERS"), "@kafka:", "the controller quorum is this node")

		listeners := parseListeners(t, kenv("KAFKA_LISTENERS"))
		advertised := parseListeners(t, kenv("KAFKA_ADVERTISED_LISTENERS"))
		protocols := map[string]string{}
		for _, m := range strings.Split(kenv("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"), ",") {
			name, proto, ok := strings.Cut(strings.TrimSpace(m), ":")
			require.True(t, ok, "listener protocol map entry %q", m)
			protocols[name] = proto
		}
		for _, name := range sluiceServices {
			v, ok := env[name]["SLUICE_BROKERS"]
			if !ok {
				continue
			}
			for _, hp := range splitAddrs(t, v) {
				var listener string
				for l, a := range advertised {
					if a == hp {
						listener = l
					}
				}
				require.NotEmpty(t, listener, "service %s: SLUICE_BROKERS %s is not an advertised listener %v", name, hp, advertised)
				require.Equal(t, "PLAINTEXT", protocols[listener], "sluice speaks plaintext Kafka")
				_, port := splitHostPort(t, hp)
				_, lport := splitHostPort(t, listeners[listener])
				require.Equal(t, port, lport, "listener %s binds another port than it advertises", listener)
			}
		}
	})

	t.Run("redis keeps nothing", func(t *testing.T) {
		r := svc("redis")
		require.Empty(t, r.Volumes, "redis: no volumes")
		c := []string(r.Command)
		require.NotEmpty(t, c)
		require.Equal(t, "redis-server", c[0])
		require.Equal(t, "", optionValue(t, c, "--save"), "redis: no RDB snapshots")
		require.Equal(t, "no", optionValue(t, c, "--appendonly"), "redis: no AOF")
		port := "6379"
		if slices.Contains(c, "--port") {
			port = optionValue(t, c, "--port")
		}
		for _, name := range sluiceServices {
			if v, ok := env[name]["SLUICE_REDIS_ADDR"]; ok {
				for _, hp := range splitAddrs(t, v) {
					_, p := splitHostPort(t, hp)
					require.Equal(t, port, p, "service %s: SLUICE_REDIS_ADDR port", name)
				}
			}
		}
	})

	t.Run("sink is provisioned at the pool capacity", func(t *testing.T) {
		c := []string(svc("sink").Command)
		capacity := optionValue(t, c, "--capacity")
		_, listenPort := splitHostPort(t, optionValue(t, c, "--listen"))
		for _, name := range sluiceServices {
			if v, ok := env[name]["SLUICE_CAPACITY"]; ok {
				require.Equal(t, v, capacity, "service %s: SLUICE_CAPACITY ≠ the sink's --capacity (one provisioned rate)", name)
			}
			if v, ok := env[name]["SLUICE_SINK"]; ok {
				u, err := url.Parse(v)
				require.NoError(t, err)
				require.Equal(t, "http", u.Scheme)
				require.Equal(t, listenPort, u.Port(), "service %s: SLUICE_SINK port ≠ the sink's --listen port", name)
			}
		}
	})

	t.Run("loader reads the repository's testdata", func(t *testing.T) {
		var target string
		for _, v := range svc("loader").Volumes {
			if v.Type == types.VolumeTypeBind && v.Source == filepath.Join(root, "testdata") {
				target = v.Target
				require.True(t, v.ReadOnly, "loader: mount testdata read-only")
			}
		}
		require.NotEmpty(t, target, "loader: mounts ./testdata")
		var files []string
		for _, a := range args["loader"] {
			if !strings.HasPrefix(a, "-") {
				files = append(files, a)
			}
		}
		require.Len(t, files, 1, "bulk-load takes one FILE: %q", args["loader"])
		rel, ok := strings.CutPrefix(path.Clean(files[0]), target+"/")
		require.True(t, ok, "loader: FILE %s is not under the testdata mount %s", files[0], target)
		st, err := os.Stat(filepath.Join(root, "testdata", filepath.FromSlash(rel)))
		require.NoError(t, err, "loader: FILE %s", files[0])
		require.True(t, st.Mode().IsRegular())
	})
}

// loadCompose loads the compose file as `docker compose` would: OS
// environment and an optional .env for interpolation, paths resolved
// against the project directory.
func loadCompose(t *testing.T, dir, file string, profiles ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{file},
		cli.WithWorkingDirectory(dir),
		cli.WithOsEnv,
		cli.WithEnvFiles(),
		cli.WithDotEnv,
		cli.WithName(composeProjectName),
		cli.WithProfiles(profiles),
		cli.WithResolvedPaths(true),
	)
	require.NoError(t, err)
	p, err := opts.LoadProject(context.Background())
	require.NoError(t, err, "docker-compose.yml does not load")
	return p
}

// optionValue returns the argument after opt (or after opt=).
func optionValue(t *testing.T, args []string, opt string) string {
	t.Helper()
	for i, a := range args {
		if a == opt {
			require.Less(t, i+1, len(args), "%s has no value in %q", opt, args)
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, opt+"="); ok {
			return v
		}
	}
	require.Failf(t, "option missing", "%s not in %q", opt, args)
	return ""
}

// parseListeners maps a Kafka listener list (NAME://host:port,...) by name.
func parseListeners(t *testing.T, v string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range strings.Split(v, ",") {
		name, hp, ok := strings.Cut(strings.TrimSpace(l), "://")
		require.True(t, ok, "listener %q", l)
		out[name] = hp
	}
	return out
}

func splitAddrs(t *testing.T, v string) []string {
	t.Helper()
	if u, err := url.Parse(v); err == nil && u.Scheme != "" && u.Host != "" {
		return []string{u.Host}
	}
	addrs := trimAll(strings.Split(v, ","))
	require.NotEmpty(t, addrs)
	return addrs
}

func splitHostPort(t *testing.T, hp string) (host, port string) {
	t.Helper()
	host, port, err := net.SplitHostPort(hp)
	require.NoError(t, err, "%q is not host:port", hp)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	require.True(t, n > 0 && n < 1<<16, "port %d", n)
	return host, port
}

func trimAll(ss []string) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		out = append(out, strings.TrimSpace(s))
	}
	return out
}
