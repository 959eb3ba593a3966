// Command etcd is the etcd server pod-checkpointer's end-to-end tests run, built from
// go.etcd.io/etcd/server/v3 (its etcdmain, without the root module's tools).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
