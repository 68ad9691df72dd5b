// Package e2e holds sluice's end-to-end tests. The multi-process cases
// (separate sluice worker, sink-sim and bulk-load processes against a real
// Apache Kafka broker and a real redis-server started by scripts/, and bulk
// loads into DynamoDB Local and MinIO, also started by scripts/, and the
// release image built without Docker and run under podman) carry the
// build tag e2e and run with `make e2e`; the checks of the deployment files
// (docker-compose.yml, the Docker build context, the Helm chart under
// deploy/helm, the Grafana dashboard under deploy/grafana) run with every
// `go test ./...`. Nothing imports this package.
package e2e
