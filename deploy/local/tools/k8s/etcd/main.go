// Command etcd is the etcd v3.6 server, built from the same module graph as the Kubernetes
// binaries. Debian's etcd-server package is 3.4: too old for Kubernetes 1.35, which is tested
// against etcd 3.6 (its hack/lib/etcd.sh pins 3.6.6). Upstream's server module cannot be
// `go install`ed at a version because its go.mod carries replace directives, hence this main.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
