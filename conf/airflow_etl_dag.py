"""Example Airflow DAG: the incremental ETL every hour, through spark-submit (copy into Airflow's dags/ folder).

Each run classifies only the images that arrived since the previous one (the checkpoint remembers), so a failed
or killed run needs no clean-up: the next one, or a retry, continues where it stopped, and every image lands
in the output exactly once. `max_active_runs=1`: two runs must never share a checkpoint.
Only `BashOperator` is used, so it works without the Spark provider package; with it, SparkSubmitOperator
takes the same application and arguments.
"""

from datetime import datetime, timedelta

from airflow import DAG
from airflow.operators.bash import BashOperator

SPARK_CNN = "/opt/spark_cnn"  # docker/Dockerfile's layout
MASTER = "spark://spark-master:7077"  # docker/compose.yaml's master

with DAG(
    dag_id="spark_cnn_incremental_etl",
    schedule=timedelta(hours=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,  # one run catches up on everything new; past intervals need no runs of their own
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
) as dag:
    BashOperator(
        task_id="classify_new_images",
        bash_command=(
            f"spark-submit --master {MASTER} --properties-file {SPARK_CNN}/conf/spark-defaults-gpu.conf "
            f"{SPARK_CNN}/jobs/run.py {SPARK_CNN}/conf/etl-nightly.yaml "
            "--summary /data/etl-runs/{{ ts_nodash }}.json"
        ),
    )
