package critest_test

// subsetFocus is the part of critest make test runs (go test ./... without
// -critest.full): see the README's "Kubernetes conformance (critest)".
const subsetFocus = `Conformance`
