{{/* Names, labels and the settings several templates share. */}}

{{- define "jetway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name prefixes every object. Truncated to 50 characters so that
the longest name made from it, "<fullname>-mesh-issuer", is a DNS label.
*/}}
{{- define "jetway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "jetway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "jetway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jetway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "jetway.labels" -}}
helm.sh/chart: {{ include "jetway.chart" . }}
{{ include "jetway.selectorLabels" . }}
app.kubernetes.io/version: {{ include "jetway.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "jetway.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "jetway.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "jetway.imageTag" .) }}
{{- end }}
{{- end }}

{{- define "jetway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "jetway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "jetway.authSecretName" -}}
{{- default (printf "%s-auth" (include "jetway.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "jetway.meshServiceName" -}}
{{- printf "%s-mesh" (include "jetway.fullname" .) }}
{{- end }}

{{/* The mesh Service's DNS name: peers resolve it to every replica. */}}
{{- define "jetway.meshServiceHost" -}}
{{- printf "%s.%s.svc" (include "jetway.meshServiceName" .) .Release.Namespace }}
{{- end }}

{{- define "jetway.meshCASecretName" -}}
{{- default (printf "%s-mesh-ca" (include "jetway.fullname" .)) .Values.mesh.ca.existingSecret }}
{{- end }}

{{/*
How the gateways join a Concourse: "tsa" (concourse.tsa), "rest" (the web
node's REST API: concourse.url without concourse.tsa, or the REST API's
client), or "" (none). jetway.validateConcourse makes sure the values of
the one chosen are whole and no others are set.
*/}}
{{- define "jetway.concourseMode" -}}
{{- $cc := .Values.concourse }}
{{- if $cc.tsa }}tsa
{{- else if or $cc.url $cc.clientId $cc.clientSecret.existingSecret }}rest
{{- end }}
{{- end }}

{{/*
The Secret mounted at /etc/jetway/concourse: the TSA's keys (an existing
Secret or the chart's), or the REST API client's secret (always an
existing one: the chart never holds it).
*/}}
{{- define "jetway.concourseSecretName" -}}
{{- if eq (include "jetway.concourseMode" .) "rest" }}
{{- .Values.concourse.clientSecret.existingSecret }}
{{- else }}
{{- default (printf "%s-concourse" (include "jetway.fullname" .)) .Values.concourse.existingSecret }}
{{- end }}
{{- end }}

{{/*
The CA Issuer signing the replicas' certificates (mesh.certManager): the
mesh CA, named as the CA Secret the chart would make.
*/}}
{{- define "jetway.meshIssuerName" -}}
{{- printf "%s-mesh-ca" (include "jetway.fullname" .) }}
{{- end }}

{{/*
The state namespace: where the gateways keep the installation's step
records and Leases. The release namespace unless state.namespace names
another; the gateway finds the release namespace itself (its pod's), so
only another one is passed as a flag.
*/}}
{{- define "jetway.stateNamespace" -}}
{{- default .Release.Namespace .Values.state.namespace }}
{{- end }}

{{/*
The Role and RoleBinding granting the state permissions: the full name in
the release namespace. In another namespace, which releases of several
namespaces may share, the release namespace comes first so that two
releases of one name do not claim the same Role.
*/}}
{{- define "jetway.stateRoleName" -}}
{{- if eq (include "jetway.stateNamespace" .) .Release.Namespace }}
{{- include "jetway.fullname" . }}
{{- else }}
{{- printf "%s-%s" .Release.Namespace (include "jetway.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The settings the chart gives as flags; flags win over the config file, so
these never come from config (the schema refuses them there).
*/}}
{{- define "jetway.args" -}}
- run
- --config
- /etc/jetway/config/config.yaml
- --listen
- ":8080"
- --targets-dir
- /etc/jetway/targets
- --shutdown-timeout
- {{ printf "%ds" (int .Values.shutdownTimeoutSeconds) | quote }}
{{- if .Values.auth.noAuth }}
- --no-auth
{{- else }}
- --auth-tokens-file
- /etc/jetway/auth/tokens.yaml
{{- end }}
{{- if .Values.mesh.enabled }}
{{- $peers := prepend .Values.mesh.peers (printf "dns:%s:%d" (include "jetway.meshServiceHost" .) (int .Values.mesh.port)) }}
- --mesh-listen
- {{ printf ":%d" (int .Values.mesh.port) | quote }}
- --mesh-peers
- {{ join "," $peers | quote }}
- --mesh-ca
- /etc/jetway/mesh/ca.crt
- --mesh-cert
- /etc/jetway/mesh/tls.crt
- --mesh-key
- /etc/jetway/mesh/tls.key
- --mesh-leave-on-stop
{{- end }}
{{- with .Values.state.namespace }}
- --state-namespace
- {{ . }}
{{- end }}
{{- $concourse := include "jetway.concourseMode" . }}
{{- if eq $concourse "tsa" }}
- --concourse-tsa
- {{ .Values.concourse.tsa | quote }}
- --concourse-tsa-public-key
- /etc/jetway/concourse/tsa_host_key.pub
- --concourse-worker-key
- /etc/jetway/concourse/worker_key
{{- else if eq $concourse "rest" }}
{{- /* concourse-worker-address is the pod's IP, JETWAY_CONCOURSE_WORKER_ADDRESS (deployment.yaml) */}}
- --concourse-client-id
- {{ .Values.concourse.clientId | quote }}
- --concourse-client-secret-file
- /etc/jetway/concourse/client_secret
{{- end }}
{{- with .Values.concourse.url }}
- --concourse-url
- {{ . | quote }}
{{- end }}
{{- if eq $concourse "rest" }}
- --concourse-web-node-networks
- {{ join "," .Values.concourse.webNodeNetworks | quote }}
{{- if .Values.concourse.insecure }}
- --concourse-insecure
{{- end }}
{{- end }}
{{- if and $concourse .Values.concourse.resourceTypes }}
- --concourse-resource-types
- /etc/jetway/config/resource-types.yaml
{{- end }}
{{- end }}

{{/*
Checks across values that the schema cannot say clearly; each fails the
render with what to do.
*/}}
{{- define "jetway.validate" -}}
{{- $auth := .Values.auth }}
{{- if $auth.noAuth }}
{{- if or $auth.existingSecret $auth.tokens }}
{{- fail "auth: noAuth contradicts auth.existingSecret and auth.tokens; give one of them" }}
{{- end }}
{{- else if and $auth.existingSecret $auth.tokens }}
{{- fail "auth: give auth.existingSecret or auth.tokens, not both" }}
{{- else if not (or $auth.existingSecret $auth.tokens) }}
{{- fail "auth: the API needs tokens: set auth.tokens (a list of {name, token, team | admin: true}) or auth.existingSecret (a Secret with the key tokens.yaml); auth.noAuth=true serves without authentication (local experiments only)" }}
{{- end }}
{{- range $i, $t := $auth.tokens }}
{{- if eq (default false $t.admin) (not (empty $t.team)) }}
{{- fail (printf "auth.tokens[%d] (%s): give exactly one of admin: true or team" $i $t.name) }}
{{- end }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if has .name (list "JETWAY_STATE_KUBECONFIG" "JETWAY_STATE_NAMESPACE") }}
{{- fail (printf "extraEnv: %s would move the gateways' step state away from the Role the chart grants; set state.namespace instead" .name) }}
{{- end }}
{{- if and (hasPrefix "JETWAY_CONCOURSE_" .name) (ne .name "JETWAY_CONCOURSE_VERSION") }}
{{- fail (printf "extraEnv: %s is a setting the chart gives from the concourse values (with the files it mounts, and the pod's IP as the REST API's worker address); set those instead" .name) }}
{{- end }}
{{- end }}
{{- include "jetway.validateConcourse" . }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable) }}
{{- fail "podDisruptionBudget: give maxUnavailable or minAvailable" }}
{{- end }}
{{- end }}

{{/*
The concourse values: the gateway's rule (the TSA with both keys, or the
REST API with its URL and client, not both), and the TSA's keys from one
place. No message quotes a key: a fail is printed, and may be logged.
*/}}
{{- define "jetway.validateConcourse" -}}
{{- $cc := .Values.concourse }}
{{- $tsa := list }}
{{- range $k := list "tsa" "existingSecret" "tsaPublicKey" "workerKey" }}
{{- if index $cc $k }}
{{- $tsa = append $tsa (printf "concourse.%s" $k) }}
{{- end }}
{{- end }}
{{- $client := list }}
{{- if $cc.clientId }}
{{- $client = append $client "concourse.clientId" }}
{{- end }}
{{- if $cc.clientSecret.existingSecret }}
{{- $client = append $client "concourse.clientSecret.existingSecret" }}
{{- end }}
{{- if and $tsa $client }}
{{- fail (printf "concourse: %s (the TSA's) and %s (the REST API's client) are both set: the targets register through one of them, the TSA (concourse.tsa and its keys) or the REST API (concourse.url, concourse.clientId and concourse.clientSecret.existingSecret)" (join ", " $tsa) (join ", " $client)) }}
{{- else if $cc.tsa }}
{{- include "jetway.validateConcourseTSA" . }}
{{- else if $tsa }}
{{- $set := $tsa }}
{{- if $cc.resourceTypes }}
{{- $set = append $set "concourse.resourceTypes" }}
{{- end }}
{{- if $cc.url }}
{{- fail (printf "concourse: %s set, but concourse.tsa is empty: those are the TSA's keys; with concourse.url and without concourse.tsa the targets register through the REST API, whose client is concourse.clientId with its secret in concourse.clientSecret.existingSecret" (join ", " $set)) }}
{{- end }}
{{- fail (printf "concourse: %s set, but concourse.tsa is empty: set it to the web node's TSA (host:port), or leave the concourse values empty to join no Concourse" (join ", " $set)) }}
{{- else if or $cc.url $client }}
{{- include "jetway.validateConcourseREST" . }}
{{- else if $cc.resourceTypes }}
{{- fail "concourse: concourse.resourceTypes set, but the targets join no Concourse: set concourse.tsa (its TSA) or concourse.url, concourse.clientId and concourse.clientSecret.existingSecret (its REST API), or leave concourse.resourceTypes empty" }}
{{- end }}
{{- if ne (include "jetway.concourseMode" .) "rest" }}
{{- $rest := "only with the REST API (concourse.url, concourse.clientId and concourse.clientSecret.existingSecret, without concourse.tsa)" }}
{{- if $cc.webNodeNetworks }}
{{- fail (printf "concourse.webNodeNetworks: %s: through the TSA the web node's calls come over the registration's own SSH connection" $rest) }}
{{- else if $cc.webNodePeers }}
{{- fail (printf "concourse.webNodePeers: %s: they are admitted to the workers' Garden and volume listeners, which only the REST API's registration opens" $rest) }}
{{- else if $cc.insecure }}
{{- fail (printf "concourse.insecure: %s: nothing secret travels on concourse.url otherwise" $rest) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The TSA's keys: an existing Secret or both keys as values. */}}
{{- define "jetway.validateConcourseTSA" -}}
{{- $cc := .Values.concourse }}
{{- if and $cc.existingSecret (or $cc.tsaPublicKey $cc.workerKey) }}
{{- fail "concourse: give concourse.existingSecret or concourse.tsaPublicKey and concourse.workerKey, not both" }}
{{- else if not (or $cc.existingSecret $cc.tsaPublicKey $cc.workerKey) }}
{{- fail "concourse: concourse.tsa needs the TSA's host public key and a worker key: set concourse.existingSecret (a Secret with the keys tsa_host_key.pub and worker_key, as concourse generate-key names them) or concourse.tsaPublicKey and concourse.workerKey" }}
{{- else if not $cc.existingSecret }}
{{- if not $cc.tsaPublicKey }}
{{- fail "concourse.tsaPublicKey: required with concourse.workerKey (the .pub of the web node's --tsa-host-key)" }}
{{- else if not $cc.workerKey }}
{{- fail "concourse.workerKey: required with concourse.tsaPublicKey (the private key whose .pub is in the web node's --tsa-authorized-keys)" }}
{{- else if not (contains "PRIVATE KEY" $cc.workerKey) }}
{{- fail "concourse.workerKey: not a private key (a PEM block, as in the worker_key concourse generate-key writes); its .pub goes to the web node's --tsa-authorized-keys" }}
{{- else if contains "PRIVATE KEY" $cc.tsaPublicKey }}
{{- fail "concourse.tsaPublicKey: holds a private key; give the TSA's public host key (tsa_host_key.pub), never its private one" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The REST API: the web node's URL (https:// unless insecure: the client's
secret travels on it), its client, the client's secret in an existing
Secret and the web node's networks (the workers' listeners take no
credential), all of them (every problem named at once), as the gateway
checks them. The worker address is the pod's IP, which the chart gives
itself.
*/}}
{{- define "jetway.validateConcourseREST" -}}
{{- $cc := .Values.concourse }}
{{- $problems := list }}
{{- if not $cc.url }}
{{- $problems = append $problems "concourse.url: required with concourse.clientId and concourse.clientSecret.existingSecret (the REST API): the web node's external URL, https://HOST[:PORT] (its --external-url)" }}
{{- end }}
{{- if and (hasPrefix "http:" $cc.url) (not $cc.insecure) }}
{{- $problems = append $problems "concourse.url: http:// with the REST API: the client secret, and the tokens it buys, would travel on it unencrypted; give the web node's https:// URL, or set concourse.insecure=true to allow it (a network you trust alone)" }}
{{- end }}
{{- if not $cc.clientId }}
{{- $problems = append $problems "concourse.clientId: required with concourse.url and without concourse.tsa (the REST API): the ID of the web node's client for jetway (concourse web --add-client ID:SECRET --system-claim-value ID)" }}
{{- end }}
{{- if not $cc.clientSecret.existingSecret }}
{{- $problems = append $problems (printf "concourse.clientSecret.existingSecret: required with concourse.url and without concourse.tsa (the REST API): a Secret holding the client's secret under the key %s (concourse.clientSecret.key)" $cc.clientSecret.key) }}
{{- end }}
{{- if not $cc.webNodeNetworks }}
{{- $problems = append $problems "concourse.webNodeNetworks: required with the REST API: the CIDRs or IPs the web node calls the workers from, e.g. its pods' CIDR (its nodes', when it runs outside the cluster); the workers' Garden and volume listeners take no credential, so the gateway and the chart's NetworkPolicy admit only these to them (0.0.0.0/0 admits anyone who reaches the pods, to run processes in any team's containers)" }}
{{- end }}
{{- if $problems }}
{{- fail (join "; " $problems) }}
{{- end }}
{{- end }}
