#!/usr/bin/env bash
# Image entrypoint. Spark on Kubernetes starts pods with the argument `driver` or `executor`
# and passes everything else in SPARK_* variables (the contract of Spark's own image, whose
# entrypoint pyspark's wheel does not ship); any other command (spark-class, spark-submit,
# spark-cnn, bash) runs as given. All run under tini, which reaps orphaned sidecars.
set -euo pipefail

case "${1:-}" in
  driver)
    shift
    set -- spark-submit --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # SPARK_JAVA_OPT_0, _1, ... hold the executor JVM's options, in that order.
    mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    set -- java "${java_opts[@]}" -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_CONF_DIR}:${SPARK_HOME}/jars/*${SPARK_CLASSPATH:+:${SPARK_CLASSPATH}}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
esac
exec tini -s -- "$@"
