// Command schemas writes JSON Schemas of the Kubernetes kinds Parley's chart renders, generated from the
// Go types of k8s.io/api, named as kubeconform looks them up ({kind}-{group}-{version}.json), so the
// manifests validate with no network. Types and unknown fields are checked; required fields are not
// (the Go types do not say which are required).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"github.com/invopop/jsonschema"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var kinds = map[string]any{
	"deployment-apps-v1":                     appsv1.Deployment{},
	"statefulset-apps-v1":                    appsv1.StatefulSet{},
	"service-v1":                             corev1.Service{},
	"configmap-v1":                           corev1.ConfigMap{},
	"serviceaccount-v1":                      corev1.ServiceAccount{},
	"horizontalpodautoscaler-autoscaling-v2": autoscalingv2.HorizontalPodAutoscaler{},
	"job-batch-v1":                           batchv1.Job{},
	"poddisruptionbudget-policy-v1":          policyv1.PodDisruptionBudget{},
}

func oneOf(types ...string) *jsonschema.Schema {
	s := &jsonschema.Schema{}
	for _, t := range types {
		s.OneOf = append(s.OneOf, &jsonschema.Schema{Type: t})
	}
	return s
}

// mapper: types whose JSON form is not their Go struct (they marshal themselves).
func mapper(t reflect.Type) *jsonschema.Schema {
	switch t {
	case reflect.TypeOf(resource.Quantity{}):
		return oneOf("string", "number")
	case reflect.TypeOf(intstr.IntOrString{}):
		return oneOf("string", "integer")
	case reflect.TypeOf(metav1.Time{}), reflect.TypeOf(metav1.MicroTime{}):
		return oneOf("string", "null")
	case reflect.TypeOf(metav1.Duration{}):
		return &jsonschema.Schema{Type: "string"}
	case reflect.TypeOf(runtime.RawExtension{}):
		return &jsonschema.Schema{}
	}
	return nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: schemas OUT_DIR")
		os.Exit(2)
	}
	out := os.Args[1]
	if err := os.MkdirAll(out, 0o755); err != nil {
		panic(err)
	}
	r := &jsonschema.Reflector{Mapper: mapper, RequiredFromJSONSchemaTags: true}
	for name, v := range kinds {
		data, err := json.MarshalIndent(r.Reflect(v), "", " ")
		if err != nil {
			panic(err)
		}
		if err := os.WriteFile(filepath.Join(out, name+".json"), data, 0o644); err != nil {
			panic(err)
		}
	}
	fmt.Printf("%d schemas in %s\n", len(kinds), out)
}
