// A console user with a password and a grant of every datastore, in a real headless
// Chromium: a wrong password is refused in the page; the right one shows both
// datastores and the fleet (every host of every datastore); a snapshot id that does
// not exist gets a message, not a broken page; and when the S3 storage of one
// datastore goes down while the page is open, the page says so and the other
// datastore still browses. Called by crates/cairn-cli/tests/it/server.rs.
//
// env: CONSOLE_URL, USER_NAME, USER_PASSWORD, S3_DS (the datastore on S3),
// CUT_FILE (created to take that S3 down), SHOT_DIR.
import { writeFileSync } from "node:fs";
import { alertAfter, drive } from "./drive.mjs";

const url = process.env.CONSOLE_URL;
const shots = process.env.SHOT_DIR;

// Shows datastore `ds`'s overview and waits for its snapshot list.
async function openDatastore(page, ds) {
  await page.evaluate((d) => (location.hash = "#ds=" + d), ds);
  await page.waitForFunction(
    (d) => !document.querySelector("#hosts").hidden && document.querySelector("#hosts-ds").textContent === d,
    {},
    ds,
  );
  await page.waitForSelector("#snapshot-rows tr a", { visible: true });
}

async function rows(page, body) {
  return page.$$eval(`#${body} tr`, (trs) =>
    trs.map((r) => {
      const o = { name: r.querySelector("th").textContent };
      for (const c of r.querySelectorAll("td")) if (c.dataset.field) o[c.dataset.field] = c.textContent;
      return o;
    }),
  );
}

await drive(async (browser, out) => {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
  await page.goto(url, { waitUntil: "load" });
  await page.waitForSelector("#user-name", { visible: true });

  // A wrong password: refused in the page.
  out.wrong_password_alert = await alertAfter(page, async () => {
    await page.type("#user-name", process.env.USER_NAME);
    await page.type("#user-password", "not the password");
    await page.keyboard.press("Enter");
  });
  out.password_field_cleared = await page.$eval("#user-password", (e) => e.value === "");

  // The right one, from the keyboard.
  await page.$eval("#user-name", (e) => (e.value = ""));
  await page.type("#user-name", process.env.USER_NAME);
  await page.type("#user-password", process.env.USER_PASSWORD);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#fleet-rows tr");
  out.who = await page.$eval("#who-text", (e) => e.textContent);
  out.datastores = await rows(page, "datastore-rows");
  out.fleet = await rows(page, "fleet-rows");
  out.fleet_note = await page.$eval("#fleet-note", (e) => e.textContent);
  if (shots) await page.screenshot({ path: `${shots}/console-fleet.png`, fullPage: true });

  // A snapshot id that does not exist: a message, and the page still works.
  out.bogus_snapshot_alert = await alertAfter(page, async () => {
    await page.evaluate(() => (location.hash = "#ds=main&snap=" + "ab".repeat(32) + "&path=/"));
  });
  await openDatastore(page, "main");
  out.after_bogus = await page.$eval("#hosts-ds", (e) => e.textContent);

  // The S3 datastore: open it (its snapshots load), then its storage goes down
  // and a snapshot of it is opened.
  const s3 = process.env.S3_DS;
  await openDatastore(page, s3);
  const link = await page.$eval("#snapshot-rows tr a", (a) => a.getAttribute("href"));
  writeFileSync(process.env.CUT_FILE, "down\n");
  await new Promise((r) => setTimeout(r, 500));
  out.s3_down_alert = await alertAfter(page, async () => {
    await page.evaluate((h) => (location.hash = h), link);
  });
  if (shots) await page.screenshot({ path: `${shots}/console-storage-down.png`, fullPage: true });

  // The server keeps serving: the other datastore browses.
  await openDatastore(page, "main");
  await page.click("#snapshot-rows tr a");
  await page.waitForSelector("#entry-rows tr", { visible: true });
  out.main_entries_after_outage = await page.$$eval("#entry-rows tr", (r) => r.length);

  // Back to the overview: the fleet says what is wrong.
  await openDatastore(page, "main");
  out.fleet_note_after_outage = await page.$eval("#fleet-note", (e) => e.textContent);
});
