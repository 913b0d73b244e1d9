// Command kfakeserver runs franz-go's kfake, a Kafka cluster that speaks the
// real protocol, as a process of its own. The end-to-end tests use it where an
// in-process cluster cannot serve: a client written by other people (kcat, on
// librdkafka) reads what the sweeper produced, and the broker is killed and
// started again on the same port and data.
//
// It prints "listening HOST:PORT" once it accepts connections and runs until
// SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 0, "port to listen on (0: any free port)")
	topics := flag.String("topics", "", "topics to create, separated by commas")
	partitions := flag.Int("partitions", 3, "partitions of each topic")
	dataDir := flag.String("data-dir", "", "directory that keeps the cluster's data across restarts (empty: memory only)")
	flag.Parse()

	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(*port)}
	if *topics != "" {
		opts = append(opts, kfake.SeedTopics(int32(*partitions), strings.Split(*topics, ",")...))
	}
	if *dataDir != "" {
		// Every write reaches the disk before it is acknowledged, as a
		// broker with acks=all and one replica promises: a kill loses nothing
		// acknowledged.
		opts = append(opts, kfake.DataDir(*dataDir), kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfakeserver:", err)
		os.Exit(1)
	}
	fmt.Println("listening", c.ListenAddrs()[0])
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	c.Close()
}
