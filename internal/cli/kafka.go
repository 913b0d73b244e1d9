package cli

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outbox-sweeper/sweeper/producer/kafka"
)

// kafkaOptions are the flags of --producer kafka: what MSK, Confluent Cloud,
// Redpanda and Event Hubs' Kafka endpoint need to be reached.
type kafkaOptions struct {
	brokers         string
	topicPrefix     string
	tls             bool
	caFile          string
	saslMechanism   string
	saslUsername    string
	saslPassword    string
	maxMessageBytes int
	idempotent      bool
}

var kafkaSASLMechanisms = []string{"none", "plain", "scram-sha-256", "scram-sha-512"}

func (o *kafkaOptions) register(f *flags) {
	f.String(&o.brokers, "kafka-brokers", "", "host:port,...", "seed brokers for --producer kafka, separated by commas; each topic must exist (the sweeper never creates one)")
	f.String(&o.topicPrefix, "kafka-topic-prefix", "", "prefix", "put before each row's topic to name the Kafka topic")
	f.bool(&o.tls, "kafka-tls", "connect to the brokers with TLS (implied by --kafka-tls-ca-file), verified against the system's CAs")
	f.String(&o.caFile, "kafka-tls-ca-file", "", "path", "PEM file of the CA that signed the brokers' certificates, used instead of the system's")
	f.Enum(&o.saslMechanism, "kafka-sasl-mechanism", "none", kafkaSASLMechanisms, "SASL mechanism; MSK and Confluent Cloud use plain or scram over TLS, Event Hubs plain with user $ConnectionString")
	f.String(&o.saslUsername, "kafka-sasl-username", "", "name", "SASL user name")
	f.String(&o.saslPassword, "kafka-sasl-password", "", "secret", "SASL password (prefer the variable: it is a secret)")
	f.Int(&o.maxMessageBytes, "kafka-max-message-bytes", kafka.MaxMessageBytesDefault, "largest record batch a topic takes when the sweeper may not read the topic's max.message.bytes")
	f.Bool(&o.idempotent, "kafka-idempotent", true, "produce idempotently (needs IDEMPOTENT_WRITE on older clusters); false keeps one request in flight per broker, so order holds but a retry may store a record twice")
}

func (o *kafkaOptions) build(f *flags) (*kafka.Producer, error) {
	if o.brokers == "" {
		return nil, usagef("%s kafka needs %s", f.origin("producer"), f.originOrBoth("kafka-brokers"))
	}
	var brokers []string
	for _, b := range strings.Split(o.brokers, ",") {
		b = strings.TrimSpace(b)
		host, port, err := net.SplitHostPort(b)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return nil, usagef("invalid value %q for %s: write host:port, several separated by commas (e.g. b-1.example:9092,b-2.example:9092)", b, f.origin("kafka-brokers"))
		}
		brokers = append(brokers, b)
	}
	if o.maxMessageBytes < 512 {
		return nil, usagef("%s is %d: it must be at least 512 (Kafka's default is %d)", f.origin("kafka-max-message-bytes"), o.maxMessageBytes, kafka.MaxMessageBytesDefault)
	}
	cfg := kafka.Config{Brokers: brokers, TopicPrefix: o.topicPrefix, MaxMessageBytes: o.maxMessageBytes, NotIdempotent: !o.idempotent}
	if o.tls || o.caFile != "" {
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		if o.caFile != "" {
			pem, err := os.ReadFile(o.caFile)
			if err != nil {
				return nil, usagef("read %s: %v", f.origin("kafka-tls-ca-file"), err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, usagef("%s %s holds no PEM certificate", f.origin("kafka-tls-ca-file"), o.caFile)
			}
			cfg.TLS.RootCAs = pool
		}
	}
	mech, err := o.sasl(f)
	if err != nil {
		return nil, err
	}
	cfg.SASL = mech
	p, err := kafka.New(cfg)
	if err != nil {
		msg := err.Error()
		if o.saslPassword != "" {
			msg = strings.ReplaceAll(msg, o.saslPassword, "xxxxx")
		}
		return nil, &usageError{msg: msg}
	}
	return p, nil
}

func (o *kafkaOptions) sasl(f *flags) (sasl.Mechanism, error) {
	if o.saslMechanism == "none" {
		if o.saslUsername != "" || o.saslPassword != "" {
			return nil, usagef("%s or %s is set without %s: name the mechanism (plain, scram-sha-256 or scram-sha-512)",
				f.originOrBoth("kafka-sasl-username"), f.originOrBoth("kafka-sasl-password"), f.originOrBoth("kafka-sasl-mechanism"))
		}
		return nil, nil
	}
	if o.saslUsername == "" || o.saslPassword == "" {
		return nil, usagef("%s %s needs %s and %s", f.origin("kafka-sasl-mechanism"), o.saslMechanism,
			f.originOrBoth("kafka-sasl-username"), f.originOrBoth("kafka-sasl-password"))
	}
	switch o.saslMechanism {
	case "plain":
		return plain.Auth{User: o.saslUsername, Pass: o.saslPassword}.AsMechanism(), nil
	case "scram-sha-256":
		return scram.Auth{User: o.saslUsername, Pass: o.saslPassword}.AsSha256Mechanism(), nil
	case "scram-sha-512":
		return scram.Auth{User: o.saslUsername, Pass: o.saslPassword}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("unknown SASL mechanism %q", o.saslMechanism) // Enum refused it already
}
