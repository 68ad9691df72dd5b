// Package queue is sluice's Kafka adapter, built on segmentio/kafka-go: the
// consumer-group Source the worker drains, the Producer that bulk-load and
// produce write with, the DeadLetterWriter, offset inspection for a bulk
// load's progress, and an in-process broker for --embedded.
//
// # Guarantees
//
// Source delivers at least once. It fetches with kafka-go's
// Reader.FetchMessage (never ReadMessage) and the reader's own
// CommitInterval is 0, so nothing is committed behind sluice's back. A
// commit tracker keeps, per partition, the offsets fetched and not yet Done,
// and Run commits, every CommitInterval (default 200 ms) and once more on
// stop, only the lowest offset not yet Done — the next offset to read,
// below which every fetched record was acknowledged by the sink or
// dead-lettered. Done may come in any order and more than once. Offsets
// never fetched (compaction gaps, transaction markers) never hold a commit
// back. A crash or a stop loses nothing: at most the records not yet Done
// are redelivered to the group.
//
// Rebalances: Source joins its group with StickyGroupBalancer
// ("sluice-sticky", every member must offer it; kafka-go's range balancer
// is offered second so a group with an older member still forms). Each
// member announces the partitions it owns — those it fetched, or the group
// (DescribeGroups, matched by the member's unique client ID) confirmed as
// its own, in the generation that ends — and the leader keeps them where
// they are, spreading only the partitions of members that left and the
// excess above an even share. When a member leaves, the survivors keep
// every partition and split the leaver's.
//
// From the moment a rebalance starts (the member's join), Owns is false
// for every record already fetched and, until the new generation fetches
// or confirms its partition, nothing is committed: the pipeline drops
// those records unsent, and they are fetched again from the committed
// offset by this member, if it keeps the partition, or by the new owner; a
// member never commits a partition it lost, so late Done calls cannot
// rewind the new owner's offsets. A kept partition's re-fetch (kafka-go
// re-seeks every partition to the committed offset in each generation)
// skips the records already Done or still held, so nothing is sent twice.
// (One narrow window remains — a message of the old generation still
// buffered in kafka-go — which can only cause redelivery, never loss.) A
// commit that fails (rebalance in progress, broker down) is logged and
// retried at the next interval; Run keeps going.
//
// Shutdown: when Run's ctx is done it commits what was Done (bounded by
// CloseTimeout, default 5 s) and then closes the reader, leaving the group
// so peers take its partitions at once — a member stopped after its records
// were Done leaves nothing acknowledged uncommitted — again bounded by
// CloseTimeout
// (kafka-go's Reader.Close can hang); a timeout is an error wrapping
// ErrCloseTimeout.
//
// Producer and DeadLetterWriter write synchronously (a call returns once
// the records are stored) with RequiredAcks RequireAll (every in-sync
// replica has them), a short BatchTimeout (default 5 ms), and the Java
// client's murmur2 key hash, so a key always lands on the same partition.
// The key is the record's Key, else its ID; the ID travels in the header
// "sluice-id", which Source reads back into Record.ID.
//
// For bulk loads, Producer.ProduceAsync keeps many chunks on their way at
// once (kafka-go's asynchronous Writer, still RequireAll), compressed on
// the wire (ProducerConfig.Compression, lz4 by default), with at most
// MaxInFlight records unanswered, and answers each chunk once every record
// is acknowledged or refused: a batch the broker refuses for its content is
// sent again one record at a time, so only the record at fault gets a
// *RecordError (to be dead-lettered); a failure of the broker after
// MaxAttempts is an error for the records it left unstored. The package
// installs in kafka-go's codec table an lz4 codec that writes Kafka's
// usual 64 KiB blocks rather than pierrec/lz4's 4 MiB ones, whose buffers
// cost a bulk load 28 MB.
//
// Dead letters of topic T go to "T.dlq" with the record's key and value and
// the headers "sluice-reason" (why it can never be written), "sluice-id"
// (its idempotency key) and, for records consumed from Kafka,
// "sluice-source" ("topic/partition@offset").
//
// EnsureTopic creates topics (idempotent, broker-default replication);
// EndOffsets and CommittedOffsets (and Admin, for ingest.Offsets) read high
// watermarks and a group's committed offsets.
//
// # Security: TLS and SASL
//
// Managed Kafka (Confluent Cloud, Amazon MSK, Azure Event Hubs, Aiven) wants
// TLS, usually with SASL PLAIN or SCRAM, sometimes a client certificate.
// Security holds those settings (CA file, client certificate and key,
// server name, SASL mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512,
// username, password); NewConn validates it, reads its files and returns a
// Conn: the *tls.Config and kafka-go sasl.Mechanism (kafka-go's sasl/plain
// and sasl/scram) that every connection uses. Conn.Dialer and
// Conn.Transport build the kafka-go Dialer (Reader) and Transport (Writer,
// Client). SourceConfig, ProducerConfig (Producer and DeadLetterWriter) and
// Admin each have a Conn field; its zero value is PLAINTEXT, as before. The
// package-level EnsureTopic, EndOffsets, CommittedOffsets and GroupMembers
// are an Admin with a zero Conn: use Admin's methods of the same names for
// a secured cluster.
//
// Check connects to the bootstrap brokers and then to every broker their
// metadata lists, step by step (TCP, TLS handshake, SASL authentication,
// metadata request), and returns a *BrokerError naming the broker, the
// failed step and the connection (protocol, mechanism, user) — a command
// calls it at start-up and exits on error, because kafka-go's Reader
// retries a wrong password for ever, logging only. Admin's calls, Produce
// and DeadLetter wrap a TLS or SASL failure in a *BrokerError too. A wrong
// password fails in about a second (the broker's own delay). Passwords
// never appear in errors, String, GoString or LogValue output.
//
// StartEmbedded runs franz-go's kfake, a Kafka-protocol broker in memory,
// on 127.0.0.1, for --embedded and for tests; the tests run against a real
// broker instead when SLUICE_TEST_BROKERS is set.
package queue
