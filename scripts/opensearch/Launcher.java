// Launcher starts one OpenSearch node in this JVM from the jars that
// scripts/opensearch.sh copied from Maven Central, for tests and CI.
//
// A distribution finds its modules in modules/<name>/ folders with a
// plugin descriptor each and runs under a security manager with their
// policies; Maven Central has only the jars. So, like OpenSearch's own
// test nodes, this launcher puts the modules on the class path and hands
// their plugin classes to the node: transport-netty4 (HTTP and the
// transport layer) and analysis-common (analyzers and token filters). It
// has no security manager and no bootstrap checks (the node listens on
// the loopback address only).
//
// Usage: java -cp 'libs/*:classes' Launcher HOME
//
// HOME holds config/opensearch.yml (the settings) and config/log4j2.properties;
// the node writes its data and logs where those settings say. The node
// runs until the JVM is told to stop (SIGTERM), then closes.

import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.transport.Netty4Plugin;

public class Launcher {
    /** A node whose plugins come from the class path. */
    static final class ClasspathNode extends Node {
        ClasspathNode(Environment env) {
            super(env, List.of(Netty4Plugin.class, CommonAnalysisPlugin.class), true);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: Launcher HOME");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        Settings settings = Settings.builder().put("path.home", home.toString()).build();
        Environment env = InternalSettingsPreparer.prepareEnvironment(
            settings, Map.of(), home.resolve("config"), () -> "sluice-test");
        LogConfigurator.setNodeName(Node.NODE_NAME_SETTING.get(env.settings()));
        LogConfigurator.configure(env);

        Node node = new ClasspathNode(env);
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(10, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                closed.countDown();
            }
        }, "sluice-shutdown"));
        node.start();
        closed.await();
    }
}
