// For a module build where the Go module proxy is reachable: go mod tidy && go build.
// On Debian 12 without it, GOPATH mode ignores this file and uses Debian's package:
//   GO111MODULE=off GOPATH=/usr/share/gocode go build -o producer .
module example.com/idemq-producer

go 1.19

require github.com/rabbitmq/amqp091-go v1.5.0
