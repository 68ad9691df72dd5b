// Loopback starts DynamoDB Local listening on one address only (127.0.0.1
// unless -Dsluice.host says otherwise): DynamoDB Local's own ServerRunner
// listens on every interface and has no option to choose one. The
// arguments are ServerRunner's (-port, -inMemory, -sharedDb, ...).
// scripts/dynamodb.sh runs it as a single-file source program.

import java.lang.reflect.Field;

import com.amazonaws.services.dynamodbv2.local.main.ServerRunner;
import com.amazonaws.services.dynamodbv2.local.server.DynamoDBProxyServer;
import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

public class Loopback {
  public static void main(String[] args) throws Exception {
    String host = System.getProperty("sluice.host", "127.0.0.1");
    DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
    // The Jetty server is a private field; its connector is not bound
    // until start, so its host can still be set.
    Field field = DynamoDBProxyServer.class.getDeclaredField("server");
    field.setAccessible(true);
    Server server = (Server) field.get(proxy);
    for (Connector c : server.getConnectors()) {
      ((ServerConnector) c).setHost(host);
    }
    proxy.start();
    proxy.join();
  }
}
