package sink

import (
	"errors"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// The error mappings beyond what the conformance suites can make the real
// servers produce (deadlocks, a busy storage account).
func TestClassifyPG(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]ingest.Outcome{
		"40001": ingest.Retryable, "40P01": ingest.Retryable, "57014": ingest.Retryable, "55P03": ingest.Retryable,
		"53300": ingest.Retryable, "57P01": ingest.Retryable, "08006": ingest.Retryable,
		"23505": ingest.Permanent, "23514": ingest.Permanent, "23502": ingest.Permanent, "23503": ingest.Permanent,
		"22P02": ingest.Permanent,
	} {
		res, perRecord := classifyPG(&pgconn.PgError{Code: code, Message: "m"})
		require.True(t, perRecord, code)
		require.Equal(t, want, res.Outcome, code)
		require.Contains(t, res.Reason, code)
	}
	_, perRecord := classifyPG(&pgconn.PgError{Code: "42P01"})
	require.False(t, perRecord, "undefined table: the whole attempt fails")
	_, perRecord = classifyPG(errors.New("connection reset"))
	require.False(t, perRecord)
}

func TestClassifyAzure(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err       *azcore.ResponseError
		want      ingest.Outcome
		throttled bool
	}{
		{&azcore.ResponseError{StatusCode: 503, ErrorCode: "ServerBusy"}, ingest.Retryable, true},
		{&azcore.ResponseError{StatusCode: 504}, ingest.Retryable, false},
		{&azcore.ResponseError{StatusCode: 500, ErrorCode: "OperationTimedOut"}, ingest.Retryable, false},
		{&azcore.ResponseError{StatusCode: 429}, ingest.Retryable, true},
		{&azcore.ResponseError{StatusCode: 400, ErrorCode: "PropertyValueTooLarge"}, ingest.Permanent, false},
	} {
		res, perRecord := classifyAzure(tt.err)
		require.True(t, perRecord)
		require.Equal(t, tt.want, res.Outcome, "%d %s", tt.err.StatusCode, tt.err.ErrorCode)
		require.Equal(t, tt.throttled, res.Throttled, "%d %s", tt.err.StatusCode, tt.err.ErrorCode)
	}
	// Not the record's fault: the whole attempt failed.
	for _, err := range []error{
		errors.New("dial tcp: connection refused"),
		&azcore.ResponseError{StatusCode: 401, ErrorCode: "AuthenticationFailed"},
		&azcore.ResponseError{StatusCode: 403, ErrorCode: "AuthorizationFailure"},
		&azcore.ResponseError{StatusCode: 404, ErrorCode: "TableNotFound"},
	} {
		_, perRecord := classifyAzure(err)
		require.False(t, perRecord, "%v", err)
	}
}
