package org.mirrorflow.kafka;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.ObjectStreamClass;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.MutableProjection;
import org.apache.spark.sql.catalyst.expressions.MutableProjection$;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.expressions.Unevaluable;
import org.apache.spark.sql.catalyst.optimizer.ReplaceExpressions$;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A flow's record transforms (mirrorflow.mm2.transforms: MirrorMaker 2's Connect transforms and
 * mirrorflow's {@code record.filter}), evaluated by the copier record by record with the same
 * Spark SQL expressions the exactly-once path evaluates as DataFrame columns.
 *
 * <p>The driver analyses {@code SELECT <headers> AS headers, <keep> AS keep, <key> AS key, <value>
 * AS value} over the record's
 * columns (topic, remote_topic, partition, offset, timestamp, key, value, headers) with Spark's
 * analyser and hands the plan to {@link #encode}, which checks that it can be evaluated one
 * record at a time and serialises it into the copier's settings ({@code transform}). Each range
 * of a copy {@link #decode}s its own instance (a projection holds state and is not shared
 * between threads).
 */
public final class RecordTransform {

  private final MutableProjection projection;
  private final boolean changesHeaders;
  private final boolean changesRecord;

  private RecordTransform(MutableProjection projection, boolean changesHeaders, boolean changesRecord) {
    this.projection = projection;
    this.changesHeaders = changesHeaders;
    this.changesRecord = changesRecord;
  }

  /** A record as the transforms leave it: what to write. */
  static final class Result {
    final byte[] key;
    final byte[] value;
    final Headers headers;

    Result(byte[] key, byte[] value, Headers headers) {
      this.key = key;
      this.value = value;
      this.headers = headers;
    }
  }

  /**
   * The analysed plan of the transform's two columns, checked and serialised (base64); an
   * IllegalArgumentException says what cannot be evaluated record by record.
   */
  public static String encode(LogicalPlan analyzed) throws IOException {
    // Functions such as nvl or ifnull stand for others until the optimiser replaces them.
    LogicalPlan plan = ReplaceExpressions$.MODULE$.apply(analyzed);
    if (!(plan instanceof Project)) {
      throw new IllegalArgumentException(
          "it is not an expression of one record (no aggregate, window or generator function)");
    }
    Project project = (Project) plan;
    for (NamedExpression column : CollectionConverters.asJava(project.projectList())) {
      check((Expression) column);
    }
    ArrayList<Object> parts = new ArrayList<>();
    parts.add(project.projectList());
    parts.add(project.child().output());
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
      out.writeObject(parts);
    }
    return Base64.getEncoder().encodeToString(bytes.toByteArray());
  }

  private static void check(Expression expression) {
    if (expression instanceof Attribute) {
      return; // a column of the record: bound when the projection is made
    }
    if (expression instanceof Unevaluable) {
      throw new IllegalArgumentException(
          expression.prettyName() + " cannot be evaluated record by record");
    }
    if (!expression.deterministic()) {
      throw new IllegalArgumentException(
          expression.prettyName() + " is not deterministic: a record copied again would be "
              + "transformed differently");
    }
    for (Expression child : CollectionConverters.asJava(expression.children())) {
      check(child);
    }
  }

  /** An instance of an {@link #encode}d transform, for one thread. */
  @SuppressWarnings("unchecked")
  static RecordTransform decode(String encoded, boolean changesHeaders, boolean changesRecord)
      throws Exception {
    byte[] bytes = Base64.getDecoder().decode(encoded);
    List<Object> parts;
    try (ObjectInputStream in = new LoaderObjectInputStream(new ByteArrayInputStream(bytes))) {
      parts = (List<Object>) in.readObject();
    }
    Seq<Expression> columns = (Seq<Expression>) parts.get(0);
    Seq<Attribute> input = (Seq<Attribute>) parts.get(1);
    MutableProjection projection = MutableProjection$.MODULE$.create(columns, input);
    projection.initialize(0);
    return new RecordTransform(projection, changesHeaders, changesRecord);
  }

  /**
   * The key, value and headers to copy {@code record} with, or null when the transforms drop
   * it. {@code remote} is the topic it goes to.
   */
  Result apply(ConsumerRecord<byte[], byte[]> record, String remote) {
    Object[] row = {
      UTF8String.fromString(record.topic()),
      UTF8String.fromString(remote),
      record.partition(),
      record.offset(),
      record.timestamp() * 1000L, // as Spark's Kafka source gives it (micros)
      record.key(),
      record.value(),
      headers(record.headers()),
    };
    InternalRow out = projection.apply(new GenericInternalRow(row));
    if (out.isNullAt(1) || !out.getBoolean(1)) {
      return null;
    }
    byte[] key = record.key();
    byte[] value = record.value();
    if (changesRecord) {
      key = out.isNullAt(2) ? null : out.getBinary(2);
      value = out.isNullAt(3) ? null : out.getBinary(3);
    }
    if (!changesHeaders) {
      return new Result(key, value, record.headers());
    }
    RecordHeaders headers = new RecordHeaders();
    if (!out.isNullAt(0)) {
      ArrayData array = out.getArray(0);
      for (int i = 0; i < array.numElements(); i++) {
        InternalRow header = array.getStruct(i, 2);
        headers.add(header.getUTF8String(0).toString(), header.isNullAt(1) ? null : header.getBinary(1));
      }
    }
    return new Result(key, value, headers);
  }

  /** The headers as Spark's Kafka source gives them: null when there are none. */
  private static ArrayData headers(Headers headers) {
    List<Object> rows = new ArrayList<>();
    for (Header header : headers) {
      rows.add(new GenericInternalRow(new Object[] {UTF8String.fromString(header.key()), header.value()}));
    }
    return rows.isEmpty() ? null : new GenericArrayData(rows.toArray());
  }

  /** Resolves classes with the thread's context loader (Spark's, on an executor). */
  private static final class LoaderObjectInputStream extends ObjectInputStream {
    LoaderObjectInputStream(ByteArrayInputStream in) throws IOException {
      super(in);
    }

    @Override
    protected Class<?> resolveClass(ObjectStreamClass desc) throws IOException, ClassNotFoundException {
      ClassLoader loader = Thread.currentThread().getContextClassLoader();
      if (loader == null) {
        return super.resolveClass(desc);
      }
      try {
        return Class.forName(desc.getName(), false, loader);
      } catch (ClassNotFoundException e) {
        return super.resolveClass(desc);
      }
    }
  }
}
