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
as a memory emptyDir, the checkpoint volume, GPUs, the token file.
Argument: a dict with "ctx" (the root context) and "nnodes" (set it when
the scheduler does not tell the agent the number of nodes).
*/}}
{{- define "meshrun.agentPod" -}}
{{- $ := .ctx -}}
{{- $j := $.Values.job -}}
{{- if and (gt (int $j.gpusPerNode) 0) (ne (int $j.gpusPerNode) (int $j.nprocPerNode)) }}
{{- fail (printf "job.gpusPerNode (%d) must equal job.nprocPerNode (%d): one GPU per rank" (int $j.gpusPerNode) (int $j.nprocPerNode)) }}
{{- end -}}
{{- if ne 0 (mod (mul (int $j.nodes) (int $j.nprocPerNode)) (int $j.tp)) }}
{{- fail (printf "job.tp (%d) must divide job.nodes x job.nprocPerNode (%d)" (int $j.tp) (mul (int $j.nodes) (int $j.nprocPerNode))) }}
{{- end -}}
metadata:
  labels:
    {{- include "meshrun.agentLabels" $ | nindent 4 }}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
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
    - name: agent
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
        - name: MESHRUN_CONTROLLER
          value: http://{{ include "meshrun.controllerName" $ }}:{{ $.Values.controller.port }}
        - name: MESHRUN_JOB
          value: $(POD_NAMESPACE)/{{ include "meshrun.jobName" $ }}
        - name: MESHRUN_TOKEN_FILE
          value: /etc/meshrun/token/token
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
        - name: MESHRUN_HEALTH_PORT
          value: "29401"
        - name: MESHRUN_LOG_LEVEL
          value: {{ $j.logLevel }}
        - name: MESHRUN_WORKLOAD_CONFIG
          value: /etc/meshrun/workload/workload.json
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
          {{- if gt (int $j.gpusPerNode) 0 }}
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
        - name: workload
          mountPath: /etc/meshrun/workload
          readOnly: true
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
    - name: workload
      configMap:
        name: {{ include "meshrun.jobName" $ }}-workload
    {{- include "meshrun.tokenVolume" $ | nindent 4 }}
{{- end }}
