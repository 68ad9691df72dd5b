package queue_test

import (
	"fmt"

	"github.com/sluicehq/sluice/queue"
)

// A Confluent Cloud style connection: TLS with the system's roots and SASL
// PLAIN with an API key and secret. The Conn goes into SourceConfig.Conn,
// ProducerConfig.Conn and Admin.Conn; queue.Check(ctx, brokers, conn) at
// start-up fails fast on a wrong secret. Neither value prints the secret.
func ExampleNewConn() {
	sec := queue.Security{TLS: true, SASLMechanism: "PLAIN", Username: "API-KEY", Password: "API-SECRET"}
	conn, err := queue.NewConn(sec)
	if err != nil {
		panic(err)
	}
	fmt.Println(sec)
	fmt.Println(conn)

	_, err = queue.NewConn(queue.Security{SASLMechanism: "SCRAM-SHA-512", Username: "sluice"})
	fmt.Println(err)
	// Output:
	// SASL_SSL, PLAIN, user "API-KEY", password set
	// SASL_SSL, PLAIN, user "API-KEY"
	// queue: invalid configuration: SASL SCRAM-SHA-512 for user "sluice" needs a password
}
