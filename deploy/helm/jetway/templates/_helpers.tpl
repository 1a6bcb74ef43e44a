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
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable) }}
{{- fail "podDisruptionBudget: give maxUnavailable or minAvailable" }}
{{- end }}
{{- end }}
