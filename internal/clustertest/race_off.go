//go:build !race

package clustertest

// raceDetector is set in a build with the race detector.
const raceDetector = false
