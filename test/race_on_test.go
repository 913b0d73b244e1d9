//go:build race

package test

// raceDetector says the tests run under the race detector, which slows the
// sweeper's CPU-bound bookkeeping several times over.
const raceDetector = true
