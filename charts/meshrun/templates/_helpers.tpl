{{/*
Names are cut to 63 characters (DNS labels), with a trailing "-" removed.
*/}}
{{- define "meshrun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "meshrun.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "meshrun.controllerName" -}}
{{- printf "%s-controller" (include "meshrun.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "meshrun.tokenSecret" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else }}
{{- printf "%s-token" (include "meshrun.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "meshrun.jobName" -}}
{{- .Values.job.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* What schedules the job: job.scheduler, else job.kind. */}}
{{- define "meshrun.scheduler" -}}
{{- .Values.job.scheduler | default .Values.job.kind }}
{{- end }}

{{/* The agents' ServiceAccount and node-reader ClusterRole (topology labels). */}}
{{- define "meshrun.agentServiceAccount" -}}
{{- printf "%s-agent" (include "meshrun.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "meshrun.nodeReaderRole" -}}
{{- printf "%s-%s-node-reader" (include "meshrun.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The workload config as JSON: "device": "cuda" added with GPUs. */}}
{{- define "meshrun.workloadJson" -}}
{{- $workload := deepCopy .Values.job.workload }}
{{- if and (gt (int .Values.job.gpusPerNode) 0) (not (hasKey $workload "device")) }}
{{- $_ := set $workload "device" "cuda" }}
{{- end }}
{{- toJson $workload }}
{{- end }}

{{/*
The child Job of a JobSet (scheduler jobset or kueue) or of the Trainer
runtime: indexed, every pod at once, no pod retries of its own; exit 1 and
2 fail it through its podFailurePolicy (the set then fails), any other
exit exceeds backoffLimit 0 (the set restarts); evictions are ignored.
Argument: a dict with "completions" and "container".
*/}}
{{- define "meshrun.childJobSpec" -}}
completionMode: Indexed
completions: {{ .completions }}
parallelism: {{ .completions }}
backoffLimit: 0
podFailurePolicy:
  rules:
    - action: FailJob
      onExitCodes:
        containerName: {{ .container }}
        operator: In
        values: [1, 2]
    - action: Ignore
      onPodConditions:
        - type: DisruptionTarget
{{- end }}

{{/* JobSet policies shared by the JobSet and the Trainer runtime ("order": InOrder with a controller in the set). */}}
{{- define "meshrun.jobSetPolicies" -}}
network:
  enableDNSHostnames: true
  publishNotReadyAddresses: true
successPolicy:
  operator: All
  targetReplicatedJobs: [{{ .target }}]
startupPolicy:
  startupPolicyOrder: {{ .order | default "AnyOrder" }}
failurePolicy:
  maxRestarts: {{ .ctx.Values.job.jobset.maxRestarts }}
  restartStrategy: Recreate
  rules:
    - name: PermanentFailure
      action: FailJobSet
      onJobFailureReasons:
        - PodFailurePolicy
    - name: RetryableFailure
      action: RestartJobSet
      onJobFailureReasons:
        - BackoffLimitExceeded
{{- end }}

{{- define "meshrun.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; the controller's add its selector labels. */}}
{{- define "meshrun.commonLabels" -}}
helm.sh/chart: {{ include "meshrun.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: meshrun
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "meshrun.labels" -}}
{{ include "meshrun.commonLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of the controller's pod. */}}
{{- define "meshrun.controllerSelector" -}}
app.kubernetes.io/name: meshrun-controller
app.kubernetes.io/component: controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the training job's pods (the PodMonitor selects name). */}}
{{- define "meshrun.agentLabels" -}}
app.kubernetes.io/name: meshrun-agent
app.kubernetes.io/component: agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: meshrun
meshrun.io/job: {{ include "meshrun.jobName" . }}
{{- end }}

{{- define "meshrun.controllerImage" -}}
{{- $t := .Values.image.controller.tag | default (printf "%s-cpu" .Chart.AppVersion) }}
{{- printf "%s:%s" .Values.image.controller.repository $t }}
{{- end }}

{{/* The CUDA image when the job asks for GPUs, else the CPU one. */}}
{{- define "meshrun.agentImage" -}}
{{- $d := ternary .Chart.AppVersion (printf "%s-cpu" .Chart.AppVersion) (gt (int .Values.job.gpusPerNode) 0) }}
{{- printf "%s:%s" .Values.image.agent.repository (.Values.image.agent.tag | default $d) }}
{{- end }}

{{/*
TLS (controller.tls): the controller's Secret, the agents' client Secret,
the URL the agents call, and what must hold between the values.
*/}}
{{- define "meshrun.tlsSecret" -}}
{{- .Values.controller.tls.secretName | default (printf "%s-controller-tls" (include "meshrun.fullname" .) | trunc 63 | trimSuffix "-") }}
{{- end }}

{{- define "meshrun.agentTlsSecret" -}}
{{- .Values.job.tls.clientSecretName | default (printf "%s-agent-tls" (include "meshrun.fullname" .) | trunc 63 | trimSuffix "-") }}
{{- end }}

{{- define "meshrun.controllerUrl" -}}
{{- printf "%s://%s:%v" (ternary "https" "http" .Values.controller.tls.enabled) (include "meshrun.controllerName" .) .Values.controller.port }}
{{- end }}

{{- define "meshrun.tlsCheck" -}}
{{- $t := .Values.controller.tls }}
{{- $cm := $t.certManager.issuerRef.name }}
{{- if and $t.enabled (not $t.secretName) (not $cm) }}
{{- fail "controller.tls.enabled needs controller.tls.secretName (a kubernetes.io/tls Secret) or controller.tls.certManager.issuerRef.name (cert-manager fills one)" }}
{{- end }}
{{- if and $t.clientCA.enabled (not $t.enabled) }}
{{- fail "controller.tls.clientCA.enabled needs controller.tls.enabled: client certificates are asked for in the TLS handshake" }}
{{- end }}
{{- if and $t.clientCA.enabled .Values.job.enabled (not .Values.job.tls.clientSecretName) (not $cm) }}
{{- fail "controller.tls.clientCA.enabled needs job.tls.clientSecretName (the agents' client certificate) or controller.tls.certManager.issuerRef.name" }}
{{- end }}
{{- $sm := .Values.monitoring.serviceMonitor }}
{{- if and $t.clientCA.enabled $sm.enabled (not $sm.tlsClientSecretName) (not .Values.job.tls.clientSecretName) (not $cm) }}
{{- fail "controller.tls.clientCA.enabled needs monitoring.serviceMonitor.tlsClientSecretName or job.tls.clientSecretName (Prometheus' client certificate) or controller.tls.certManager.issuerRef.name" }}
{{- end }}
{{- if and $t.enabled .Values.job.enabled .Values.job.jobset.ownController (has (include "meshrun.scheduler" .) (list "jobset" "kueue")) }}
{{- fail "controller.tls does not cover job.jobset.ownController: the set's own controller is reached by its pod's DNS name, which the certificate does not carry" }}
{{- end }}
{{- end }}

{{/* The controller's TLS flags (files of the Secret mounted at /etc/meshrun/tls). */}}
{{- define "meshrun.controllerTlsArgs" -}}
{{- if .Values.controller.tls.enabled }}
- --tls-cert=/etc/meshrun/tls/tls.crt
- --tls-key=/etc/meshrun/tls/tls.key
{{- with .Values.controller.tls.clientCA }}
{{- if .enabled }}
- --tls-client-ca=/etc/meshrun/{{ ternary "tls-client-ca" "tls" (not (not .secretName)) }}/ca.crt
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The token volume (the Secret's key mounted as a file). */}}
{{- define "meshrun.tokenVolume" -}}
- name: token
  secret:
    secretName: {{ include "meshrun.tokenSecret" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.auth.secretKey }}
        path: token
{{- end }}

{{- define "meshrun.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The pod template of the training job: the agent with its probes, /dev/shm
as a memory emptyDir, the checkpoint volume, GPUs, the token file; with
controller.tls the CA (and, with clientCA, a client certificate).
Argument: a dict with "ctx" (the root context), "nnodes" (set it when
the scheduler does not tell the agent the number of nodes), "subdomain",
"annotations" (of the pod) and "runtime" (true: the Trainer runtime's
template, container "node"; the TrainJob gives size, resources and
workload).
*/}}
{{- define "meshrun.agentPod" -}}
{{- $ := .ctx -}}
{{- $j := $.Values.job -}}
{{- $topo := $j.topology.labels -}}
{{- $runtime := .runtime -}}
{{- $sched := include "meshrun.scheduler" $ -}}
{{- if and (eq $sched "kueue") (not $j.kueue.queueName) }}
{{- fail "job.kueue.queueName is required when job.scheduler is kueue (the LocalQueue of kueue.x-k8s.io/queue-name)" }}
{{- end -}}
{{- range $k := list "requiredTopology" "preferredTopology" }}
{{- $l := get $j.kueue $k }}
{{- if and $l (not (has $l $topo)) }}
{{- fail (printf "job.kueue.%s (%s) must be one of job.topology.labels, so that the agents rank by the domains Kueue placed them in" $k $l) }}
{{- end }}
{{- end -}}
{{- if and (eq $sched "volcano") $j.volcano.networkTopology.mode (not $topo) }}
{{- fail "job.volcano.networkTopology needs job.topology.labels: the agents rank by the topology Volcano placed them by" }}
{{- end -}}
{{- if and (gt (int $j.gpusPerNode) 0) (ne (int $j.gpusPerNode) (int $j.nprocPerNode)) }}
{{- fail (printf "job.gpusPerNode (%d) must equal job.nprocPerNode (%d): one GPU per rank" (int $j.gpusPerNode) (int $j.nprocPerNode)) }}
{{- end -}}
{{- if ne 0 (mod (mul (int $j.nodes) (int $j.nprocPerNode)) (int $j.tp)) }}
{{- fail (printf "job.tp (%d) must divide job.nodes x job.nprocPerNode (%d)" (int $j.tp) (mul (int $j.nodes) (int $j.nprocPerNode))) }}
{{- end -}}
metadata:
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  labels:
    {{- if $runtime }}
    app.kubernetes.io/name: meshrun-agent
    app.kubernetes.io/component: agent
    app.kubernetes.io/instance: {{ $.Release.Name }}
    app.kubernetes.io/part-of: meshrun
    {{- else }}
    {{- include "meshrun.agentLabels" $ | nindent 4 }}
    {{- end }}
spec:
  restartPolicy: Never
  {{- if $topo }}
  # the agent reads its Node's topology labels (get on nodes, nothing else)
  serviceAccountName: {{ include "meshrun.agentServiceAccount" $ }}
  automountServiceAccountToken: true
  {{- else }}
  automountServiceAccountToken: false
  {{- end }}
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ $j.terminationGracePeriodSeconds }}
  {{- with $.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .subdomain }}
  subdomain: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml $.Values.podSecurityContext | nindent 4 }}
  {{- with $j.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $j.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ ternary "node" "agent" (not (not $runtime)) }}
      image: {{ include "meshrun.agentImage" $ }}
      imagePullPolicy: {{ $.Values.image.agent.pullPolicy }}
      env:
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if $topo }}
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        - name: MESHRUN_TOPOLOGY_LABELS
          value: {{ join "," $topo }}
        - name: MESHRUN_RANK_ORDER
          value: topology
        {{- end }}
        - name: MESHRUN_CONTROLLER
          value: {{ .controllerUrl | default (include "meshrun.controllerUrl" $) }}
        {{- if $.Values.controller.tls.enabled }}
        # the CA the controller's certificate is checked against
        - name: MESHRUN_TLS_CA
          value: /etc/meshrun/tls-ca/ca.crt
        {{- if $.Values.controller.tls.clientCA.enabled }}
        - name: MESHRUN_TLS_CERT
          value: /etc/meshrun/tls-client/tls.crt
        - name: MESHRUN_TLS_KEY
          value: /etc/meshrun/tls-client/tls.key
        {{- end }}
        {{- end }}
        {{- if $runtime }}
        # the TrainJob's name (Trainer names the JobSet after it)
        - name: TRAINJOB_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['jobset.sigs.k8s.io/jobset-name']
        - name: MESHRUN_JOB
          value: $(POD_NAMESPACE)/$(TRAINJOB_NAME)
        {{- else }}
        - name: MESHRUN_JOB
          value: $(POD_NAMESPACE)/{{ include "meshrun.jobName" $ }}
        {{- end }}
        - name: MESHRUN_TOKEN_FILE
          value: /etc/meshrun/token/token
        - name: MESHRUN_HEALTH_PORT
          value: "29401"
        {{- if not $runtime }}
        {{- with .nnodes }}
        - name: MESHRUN_NNODES
          value: {{ . | quote }}
        {{- end }}
        - name: MESHRUN_NPROC_PER_NODE
          value: {{ $j.nprocPerNode | quote }}
        - name: MESHRUN_TP
          value: {{ $j.tp | quote }}
        - name: MESHRUN_MAX_RESTARTS
          value: {{ $j.maxRestarts | quote }}
        - name: MESHRUN_LOG_LEVEL
          value: {{ $j.logLevel }}
        - name: MESHRUN_WORKLOAD_CONFIG
          value: /etc/meshrun/workload/workload.json
        {{- end }}
      ports:
        - name: metrics
          containerPort: 29401
          protocol: TCP
      livenessProbe:
        httpGet:
          path: /healthz
          port: metrics
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 6
      readinessProbe:
        httpGet:
          path: /readyz
          port: metrics
        periodSeconds: 5
      resources:
        requests:
          {{- toYaml $j.resources.requests | nindent 10 }}
        limits:
          {{- toYaml $j.resources.limits | nindent 10 }}
          {{- if and (gt (int $j.gpusPerNode) 0) (not $runtime) }}
          nvidia.com/gpu: {{ $j.gpusPerNode }}
          {{- end }}
      securityContext:
        {{- include "meshrun.containerSecurityContext" $ | nindent 8 }}
      volumeMounts:
        - name: dshm
          mountPath: /dev/shm
        - name: tmp
          mountPath: /tmp
        - name: checkpoints
          mountPath: /var/lib/meshrun/checkpoints
        - name: token
          mountPath: /etc/meshrun/token
          readOnly: true
        {{- if $.Values.controller.tls.enabled }}
        # whole volumes, no subPath: a rotated Secret reaches the files
        - name: tls-ca
          mountPath: /etc/meshrun/tls-ca
          readOnly: true
        {{- if $.Values.controller.tls.clientCA.enabled }}
        - name: tls-client
          mountPath: /etc/meshrun/tls-client
          readOnly: true
        {{- end }}
        {{- end }}
        {{- if not $runtime }}
        - name: workload
          mountPath: /etc/meshrun/workload
          readOnly: true
        {{- end }}
  volumes:
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $j.shmSize }}
    - name: tmp
      emptyDir:
        sizeLimit: 1Gi
    - name: checkpoints
      {{- if $j.checkpoints.existingClaim }}
      persistentVolumeClaim:
        claimName: {{ $j.checkpoints.existingClaim }}
      {{- else }}
      emptyDir:
        sizeLimit: {{ $j.checkpoints.emptyDirSize }}
      {{- end }}
    {{- if not $runtime }}
    - name: workload
      configMap:
        name: {{ include "meshrun.jobName" $ }}-workload
    {{- end }}
    {{- include "meshrun.tokenVolume" $ | nindent 4 }}
    {{- if $.Values.controller.tls.enabled }}
    - name: tls-ca
      secret:
        secretName: {{ $j.tls.caSecretName | default (include "meshrun.tlsSecret" $) }}
        defaultMode: 0440
        items:
          - key: ca.crt
            path: ca.crt
    {{- if $.Values.controller.tls.clientCA.enabled }}
    - name: tls-client
      secret:
        secretName: {{ include "meshrun.agentTlsSecret" $ }}
        defaultMode: 0440
        items:
          - key: tls.crt
            path: tls.crt
          - key: tls.key
            path: tls.key
    {{- end }}
    {{- end }}
{{- end }}
