package sink

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
)

// setupTimeout bounds a sink's set-up calls: describing or creating a
// table or bucket, waiting for a table to become active.
const setupTimeout = 2 * time.Minute

// awsConfig loads the AWS SDK's configuration for a sink: the default
// credential chain, region and CA bundle (AWS_CA_BUNDLE), no SDK retries
// (the worker retries, and paces and charges every attempt), checksums
// only where a service requires them (S3-compatible servers do not all
// take the SDK's trailing checksums), and an HTTP client of its own whose
// transport keeps up to 256 idle connections for parallel requests and is
// returned for Close. The client has no timeout of its own: the sinks put
// the request timeout on each write's context, and a generous one on
// set-up calls (a table being created, a server's first answer).
func awsConfig(ctx context.Context, region string) (aws.Config, *http.Transport, error) {
	opts := []func(*config.LoadOptions) error{
		config.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return cfg, nil, err
	}
	var transport *http.Transport
	if bc, ok := cfg.HTTPClient.(*awshttp.BuildableClient); ok {
		transport = bc.GetTransport() // a copy, with the CA bundle's roots
	} else {
		return cfg, nil, fmt.Errorf("unexpected HTTP client %T", cfg.HTTPClient)
	}
	transport.MaxIdleConns, transport.MaxIdleConnsPerHost = 256, 256
	cfg.HTTPClient = &http.Client{Transport: transport}
	return cfg, transport, nil
}
