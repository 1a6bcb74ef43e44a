package wire

import (
	"regexp"
	"strconv"
	"strings"
)

// Kubernetes' syntax of label values, DNS-1123 labels and resource
// quantities, written out here so that wire imports no Kubernetes
// package (k8s.io/apimachinery's validation.IsValidLabelValue,
// validation.IsDNS1123Label and resource.ParseQuantity; steps'
// TestWireQuantitiesAreKubernetesQuantities checks they agree).
var (
	labelValue = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	dnsLabel   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	// quantity is <sign><digits>[.<digits>]<suffix> as ParseQuantity
	// reads it: the suffix is decimal (n u m "" k M G T P E), binary (Ki
	// Mi Gi Ti Pi Ei) or an exponent (e or E and a 64-bit integer).
	quantity = regexp.MustCompile(`^([+-]?)([0-9]*)(\.[0-9]*)?(|[numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)$`)
)

const maxLabel = 63

func isLabelValue(s string) bool { return len(s) <= maxLabel && labelValue.MatchString(s) }

func isDNSLabel(s string) bool { return len(s) <= maxLabel && dnsLabel.MatchString(s) }

// positiveQuantity reports whether q is a Kubernetes quantity above zero
// (ParseQuantity rounds a positive amount below 1n up to 1n).
func positiveQuantity(q string) bool {
	m := quantity.FindStringSubmatch(q)
	if m == nil {
		return false
	}
	if e := m[4]; len(e) > 1 && (e[0] == 'e' || e[0] == 'E') && e[1] != 'i' {
		if _, err := strconv.ParseInt(e[1:], 10, 64); err != nil {
			return false // ParseQuantity reads the exponent as an int64
		}
	}
	return m[1] != "-" && strings.ContainsAny(m[2]+m[3], "123456789")
}
