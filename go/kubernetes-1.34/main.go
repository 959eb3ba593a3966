// Command kube is the Kubernetes components pod-checkpointer's end-to-end tests run, built
// from k8s.io/kubernetes as one multi-call binary (as hyperkube was): one link and one copy
// of the shared packages instead of five. It runs the component named by the name it was
// called by (a symlink), or by its first argument.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as kube-apiserver's and kube-controller-manager's mains

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	kubemark "k8s.io/kubernetes/cmd/kubemark/app"
)

// Each component's command, made only when it is the one run: the commands register
// flags and feature gates as they are made.
var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kubemark":                kubemark.NewHollowNodeCommand,
}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if _, ok := components[name]; !ok && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	command, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "kube: run as or with one of %v\n", names)
		os.Exit(2)
	}
	os.Args = append([]string{name}, args...)
	cmd := command()
	cmd.SetArgs(args)
	os.Exit(cli.Run(cmd))
}
