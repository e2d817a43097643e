//go:build race

package llmgateway

// raceDivisor shrinks the biggest test payloads under the race detector.
const raceDivisor = 6
