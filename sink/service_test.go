package sink

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// service is a real server the sink tests talk to: the URL in its
// environment variable, or the one its script starts (idempotent; the
// Makefile stops it), printed on the script's last line.
type service struct {
	env, script string

	once sync.Once
	url  string
	err  error
}

var (
	postgresService   = &service{env: "SLUICE_TEST_POSTGRES_URL", script: "postgres.sh"}
	azuriteService    = &service{env: "SLUICE_TEST_AZURITE_URL", script: "azurite.sh"}
	dynamoDBService   = &service{env: "SLUICE_TEST_DYNAMODB_URL", script: "dynamodb.sh"}
	s3Service         = &service{env: "SLUICE_TEST_S3_URL", script: "s3.sh"}
	jsonServerService = &service{env: "SLUICE_TEST_JSONSERVER_URL", script: "jsonserver.sh"}
)

// URL returns the server's URL, starting it once per test binary.
func (s *service) URL(t testing.TB) string {
	t.Helper()
	s.once.Do(func() {
		if s.url = os.Getenv(s.env); s.url != "" {
			return
		}
		var stderr bytes.Buffer
		cmd := exec.Command("../scripts/"+s.script, "start")
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			s.err = fmt.Errorf("scripts/%s start: %w: %s", s.script, err, stderr.String())
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		s.url = lines[len(lines)-1]
	})
	require.NoError(t, s.err)
	return s.url
}
