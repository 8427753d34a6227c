"""Run in the pinned petastorm environment: write a dataset with petastorm's own materialize_dataset.

Fields: id (string), label (int32), image (CompressedImageCodec png, RGB), pixels (NdarrayCodec, uint8 RGB).
The images come from IMAGES.npy (N, H, W, 3) and labels from LABELS.npy.
"""

import sys
import warnings

import numpy as np
from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import materialize_dataset
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, StringType

warnings.simplefilter("ignore")
images_file, labels_file, dataset_url = sys.argv[1:4]
images, labels = np.load(images_file), np.load(labels_file)
schema = Unischema("DigitsSchema", [
    UnischemaField("id", np.str_, (), ScalarCodec(StringType()), False),
    UnischemaField("label", np.int32, (), ScalarCodec(IntegerType()), False),
    UnischemaField("image", np.uint8, (None, None, 3), CompressedImageCodec("png"), False),
    UnischemaField("pixels", np.uint8, (None, None, 3), NdarrayCodec(), False),
])
spark = (SparkSession.builder.master("local[1]").appName("petastorm-writer")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
try:
    with materialize_dataset(spark, dataset_url, schema, row_group_size_mb=1):
        rows = [dict_to_spark_row(schema, {"id": f"digit-{i:04d}", "label": np.int32(label), "image": image,
                                           "pixels": image})
                for i, (image, label) in enumerate(zip(images, labels, strict=True))]
        (spark.createDataFrame(rows, schema.as_spark_schema()).repartition(3)
         .write.mode("overwrite").parquet(dataset_url))
finally:
    spark.stop()
