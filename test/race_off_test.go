//go:build !race

package test

// raceDetector says the tests run under the race detector.
const raceDetector = false
