// Module mkimage pins go-containerregistry, which builds the gateway's and
// the step agent's image tarballs without a Docker daemon or a base image,
// so the product module does not carry its dependency graph.
module github.com/jetway-ci/jetway/tools/mkimage

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
